"""Python SDK and command line for explainq, an explanation-and-training job service.

    from explainq_client import Client

    client = Client()                      # EXPLAINQ_URL, EXPLAINQ_API_KEY
    job = client.attributions(model="nrms-minilm-demo", samples=[...], n_steps=64)
    job.wait().result()                    # renders as coloured words in Jupyter

Depends on httpx only: no torch.
"""

from explainq_client._http import JobEvent, RetryPolicy
from explainq_client._kinds import NOT_GIVEN, NotGiven
from explainq_client.aio import AsyncClient, AsyncJob
from explainq_client.client import Client, Job
from explainq_client.comparison import ComparisonResult
from explainq_client.errors import (
    APIConnectionError,
    APIError,
    AuthenticationError,
    ConflictError,
    ExplainqError,
    FieldError,
    JobCanceledError,
    JobError,
    JobFailedError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    ValidationError,
    WaitTimeoutError,
)
from explainq_client.jobs import Artifact, DatasetInfo, JobPage, ModelInfo, ModelList
from explainq_client.render import diverging_color
from explainq_client.results import (
    AblationResult,
    AttributionResult,
    ClassifierInfluenceResult,
    EvaluationResult,
    Result,
    TracInResult,
    TrainingResult,
)

__version__ = "0.1.0"

__all__ = [
    "NOT_GIVEN", "APIConnectionError", "APIError", "AblationResult", "Artifact", "AsyncClient", "AsyncJob",
    "AttributionResult", "AuthenticationError", "ClassifierInfluenceResult", "Client", "ComparisonResult", "ConflictError", "DatasetInfo", "EvaluationResult",
    "ExplainqError",
    "FieldError", "Job", "JobCanceledError", "JobError", "JobEvent", "JobFailedError", "JobPage", "ModelInfo",
    "ModelList", "NotFoundError", "NotGiven", "PayloadTooLargeError", "PermissionDeniedError", "RateLimitError",
    "Result", "RetryPolicy", "ServerError", "ServiceUnavailableError", "TracInResult", "TrainingResult",
    "ValidationError", "WaitTimeoutError", "__version__", "diverging_color",
]
