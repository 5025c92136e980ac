"""One typed submit method per job kind, written once for the sync and the async client.

A parameter left at ``NOT_GIVEN`` is not sent, so the server's default applies (the defaults in the docstrings
are the server's). ``**extra`` passes fields this version of the SDK does not know yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

__all__ = ["NOT_GIVEN", "KindMethods", "NotGiven", "kind_name", "route_for"]


def kind_name(kind: str, kinds: Mapping[str, Mapping[str, Any]]) -> str:
    """``kind`` as the server names it (``train_bdh``, also given as ``train/bdh`` or ``train-bdh``); a kind not
    in ``kinds`` (name -> its ``GET /kinds`` description) raises ``ValueError`` naming those that are."""
    name = kind.replace("/", "_").replace("-", "_")
    if name not in kinds:
        raise ValueError(f"unknown job kind {kind!r}: one of {', '.join(sorted(kinds))}")
    return name


def route_for(kind: str, kinds: Mapping[str, Mapping[str, Any]]) -> str:
    """The submit route of a kind: a kind the server runs (see :func:`kind_name`), or a route given as is
    (``/test/sleep``)."""
    if kind.startswith("/"):
        return kind
    try:
        return str(kinds[kind_name(kind, kinds)]["route"])
    except ValueError as exc:
        raise ValueError(f"{exc}, or a route such as '/x'") from None


class NotGiven:
    """The type of :data:`NOT_GIVEN`: a parameter the caller left out (so ``None`` can mean JSON null)."""

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN = NotGiven()

R = TypeVar("R")
Precision = Literal["auto", "fp32", "fp16", "bf16"]
Triple = Sequence[str]


def _body(params: dict[str, Any]) -> dict[str, Any]:
    """A method's ``locals()`` as a request body: the given parameters plus ``extra``."""
    extra = params.pop("extra", {})
    for name in ("self", "idempotency_key"):
        params.pop(name, None)
    body = {k: (list(v) if k == "tags" else v) for k, v in params.items() if v is not NOT_GIVEN}
    return {**body, **extra}


class KindMethods(Generic[R]):
    """The per-kind submit methods. ``R`` is ``Job`` for :class:`Client`, an awaitable ``AsyncJob`` for
    :class:`AsyncClient`."""

    def submit(self, kind: str, body: Mapping[str, Any], *, label: str | None | NotGiven = NOT_GIVEN,
               tags: Sequence[str] | NotGiven = NOT_GIVEN,
               requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
               idempotency_key: str | None = None) -> R:
        """Submit a job of ``kind`` (a kind the server runs, see ``kinds()``, or a route) with a raw request
        ``body``; an unknown kind raises ``ValueError``. ``label`` (free text) and ``tags`` (short slugs), which
        every kind takes, are added to the body when given; the jobs list shows them and searches them
        (``client.jobs(q=..., tag=...)``). ``requirements`` (``{"gpu": true, "gpu_memory_gib": 40,
        "device_class": "a100"}``, any of them) keeps the job for a worker that has them; every typed method below
        takes it too.

        An ``Idempotency-Key`` is generated when none is given, so retries never create a second job."""
        sent = dict(body)
        if label is not NOT_GIVEN:
            sent["label"] = label
        if tags is not NOT_GIVEN:
            sent["tags"] = list(tags)
        if requirements is not NOT_GIVEN:
            sent["requirements"] = None if requirements is None else dict(requirements)
        return self._submit(kind, sent, idempotency_key)

    def _submit(self, kind_or_route: str, body: dict[str, Any], idempotency_key: str | None) -> R:
        raise NotImplementedError

    def attributions(
        self, *, model: str,
        samples: Sequence[Mapping[str, Any]] | NotGiven = NOT_GIVEN,
        dataset: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        texts: Sequence[Mapping[str, Any]] | NotGiven = NOT_GIVEN,
        inputs: Sequence[Mapping[str, Any]] | NotGiven = NOT_GIVEN,
        n_steps: int | NotGiven = NOT_GIVEN,
        method: Literal["gausslegendre", "clenshaw_curtis", "riemann_right", "riemann_left", "riemann_middle",
                        "riemann_trapezoid", "occlusion"] | None | NotGiven = NOT_GIVEN,
        tolerance: float | None | NotGiven = NOT_GIVEN,
        alpha_batch_size: int | Literal["auto"] | NotGiven = NOT_GIVEN,
        batch_size: int | Literal["auto"] | NotGiven = NOT_GIVEN,
        precision: Precision | NotGiven = NOT_GIVEN,
        baseline: Literal["pad", "mask", "zero", "mean", "blur", "custom"] | None | NotGiven = NOT_GIVEN,
        baseline_values: Sequence[Any] | None | NotGiven = NOT_GIVEN,
        top_k: int | NotGiven = NOT_GIVEN,
        optimized: bool | NotGiven = NOT_GIVEN,
        compare_with: str | None | NotGiven = NOT_GIVEN,
        compare_threshold: float | NotGiven = NOT_GIVEN,
        compare_min_count: int | NotGiven = NOT_GIVEN,
        compare_top_n: int | NotGiven = NOT_GIVEN,
        warn_relative_delta: float | NotGiven = NOT_GIVEN,
        max_history: int | NotGiven = NOT_GIVEN,
        faithfulness: bool | NotGiven = NOT_GIVEN,
        faithfulness_seed: int | NotGiven = NOT_GIVEN,
        shard_size: int | Literal["auto"] | NotGiven = NOT_GIVEN,
        max_failed_fraction: float | NotGiven = NOT_GIVEN,
        shard_retries: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Integrated Gradients of a news recommender's score over the words of candidate headlines, of a
        Hugging Face classifier's class logit over the words of texts, or of an exported classifier's class logit
        over the pixels of images or the features of tabular rows.

        For a news recommender give exactly one of ``samples`` (``[{"id", "history": [titles], "candidate",
        "label"?, "candidate_body"?}]``) or ``dataset`` (``{"name", "split"="test", "n_samples"=32, "balanced",
        "seed"}``); for a Hugging Face classifier (registry kind ``hf_classifier``) give ``texts`` (``[{"id",
        "text", "label"?, "target"?}]``, ``target`` a class index or name, by default the predicted class;
        ``baseline`` may also be ``"mask"``); for an exported classifier (registry kind ``exported_classifier``)
        give ``inputs`` (``[{"id", "values", "label"?, "target"?}]``, ``values`` nested lists in the model's
        per-example shape), with ``baseline`` ``"zero"`` (its default), ``"mean"`` (the spec's training mean),
        ``"blur"`` (images) or ``"custom"`` with ``baseline_values`` (one input's values). An exported
        classifier over token ids (its spec's input kind ``tokens``) takes ``inputs`` whose ``values`` are the
        token ids (tokenized by the caller: the service has no tokenizer for a program), with ``baseline``
        ``"pad"``, ``"mask"`` (the spec's ``pad_id`` / ``mask_id``) or ``"zero"``; its records are text records.
        Server defaults: ``n_steps=64``, ``method="gausslegendre"`` (``"clenshaw_curtis"`` when a ``tolerance``
        is given; or a ``riemann_*`` rule, ``occlusion``), ``precision="auto"``, ``baseline="pad"`` (text; ``"zero"`` for ``inputs``), ``top_k=10``. ``compare_with`` names a second model (e.g. a
        poisoned twin) whose word statistics are compared: per sample the ``compare_top_n`` (3) most changed words,
        and a table of the words seen at least ``compare_min_count`` (3) times whose mean moved by more than
        ``compare_threshold`` (0.1). A sample whose relative completeness error exceeds ``warn_relative_delta``
        (0.05) is named in the result's ``warnings``.

        ``faithfulness=True`` adds, per sample and over the run, comprehensiveness and sufficiency at 1/5/10/20/50% of
        the words and deletion/insertion curves for IG's ranking, a random one (``faithfulness_seed``) and
        occlusion's; the result's ``faithfulness`` property holds them as a table.

        A large request fans out over the workers in shards of ``shard_size`` samples (``"auto"``: about two
        minutes each, from the model's measured throughput); it fails when more than ``max_failed_fraction``
        (default 0.01) of the samples fail, and retries a failed shard ``shard_retries`` times (default 1).
        """
        return self._submit("/attributions", _body(dict(locals())), idempotency_key)

    def tracin(
        self, *, model: str,
        test_triples: Sequence[Triple] | None | NotGiven = NOT_GIVEN,
        mode: Literal["test", "self", "single"] | NotGiven = NOT_GIVEN,
        top_k: int | None | NotGiven = NOT_GIVEN,
        checkpoints: Literal["all"] | Sequence[str] | NotGiven = NOT_GIVEN,
        layers: Literal["all", "last"] | Sequence[str] | NotGiven = NOT_GIVEN,
        loss: Literal["train", "score_bce", "margin"] | NotGiven = NOT_GIVEN,
        projection_dim: int | None | NotGiven = NOT_GIVEN,
        precision: Precision | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        filter: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        train_triples: Sequence[Triple] | None | NotGiven = NOT_GIVEN,
        method: Literal["ghost", "vmap"] | NotGiven = NOT_GIVEN,
        lr_weight: Literal["last", "interval"] | NotGiven = NOT_GIVEN,
        test_triples_path: str | None | NotGiven = NOT_GIVEN,
        estimator: Literal["tracin", "tracin_projected", "trak"] | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        damping: float | NotGiven = NOT_GIVEN,
        shard_size: int | Literal["auto"] | NotGiven = NOT_GIVEN,
        max_failed_fraction: float | NotGiven = NOT_GIVEN,
        shard_retries: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """TracIn-CP influence of training triples on ConvE predictions.

        ``test_triples`` are ``[head, relation, tail]`` names (required except in ``mode="self"``, which ranks
        training triples by self-influence). Server defaults: ``mode="test"``, ``top_k=10`` (None: every
        candidate), ``checkpoints="all"``, ``layers="all"``, ``loss="score_bce"`` (``"margin"`` with the
        stored-feature estimators), ``method="ghost"``.
        ``filter={"n_hops": 1, "min_degree": 0}`` keeps candidates near the test triples.
        ``test_triples_path`` names a head/relation/tail TSV under the data roots instead of ``test_triples``.
        ``lr_weight``: each checkpoint weighs by its stored learning rate (``"last"``, default) or the sum of
        the epoch rates since the previous one (``"interval"``). Modes ``test`` and ``self`` fan out over the
        workers in shards of ``shard_size`` candidate triples (``"auto"``), failing when more than
        ``max_failed_fraction`` fail, retrying a failed shard ``shard_retries`` times.
        ``estimator="trak"`` or ``"tracin_projected"`` (approximate) answers mode ``test`` from the features
        :meth:`featurize` stored with the same checkpoints, layers, loss, ``projection_dim`` (default: the
        evaluated TRAK's k for the model) and ``seed`` (``damping``, default 0.3, for ``trak``: with every default
        it runs the configuration the attribution-quality evaluations measured); ``"tracin"`` (default) is exact
        TracIn.
        """
        return self._submit("/tracin", _body(dict(locals())), idempotency_key)

    def evaluate_attribution(
        self, *,
        dataset: str | NotGiven = NOT_GIVEN,
        recipe: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        estimators: Sequence[str] | NotGiven = NOT_GIVEN,
        m: int | NotGiven = NOT_GIVEN,
        alpha: float | NotGiven = NOT_GIVEN,
        n_test: int | NotGiven = NOT_GIVEN,
        ensemble: int | NotGiven = NOT_GIVEN,
        replicates: bool | NotGiven = NOT_GIVEN,
        output: Literal["margin", "loss"] | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        shard_retries: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """The linear datamodeling score (LDS) of data-attribution estimators on a ConvE recipe (queue ``bulk``).

        ``m`` models are trained on random ``alpha``-subsets of ``dataset``'s training triples (one shard each),
        and each estimator's scores, computed on the full-data model, predict the subset models' margins on
        ``n_test`` test triples; the result has each estimator's LDS per test triple, its mean with a 95%
        bootstrap interval and its time. ``recipe`` holds ConvE's training settings (``epochs``,
        ``embedding_dim``, ...). Server defaults: ``dataset="nations"``, ``m=64``, ``alpha=0.5``,
        ``n_test=100``, ``estimators=["tracin", "tracin_last", "trak", "trak_ensemble", "graddot", "gradcos",
        "random"]``, ``output="margin"`` (TracIn's and the gradient baselines' test side: the margin the LDS
        measures, or ``"loss"``; each estimator's result states its ``output``),
        ``ensemble=4`` (the further full-data models, other seeds, that ``trak_ensemble`` averages over). Every
        estimator but TracIn also gets its LDS as a ratio to TracIn's with a paired bootstrap interval
        (``ratio_to_tracin``). ``replicates=True`` trains every subset model again with another seed and reports
        the ground truth's ``noise_ceiling`` (how high any LDS can be). Another ``seed`` is an independent
        replicate. A later evaluation of the same recipe, data, ``alpha``, ``m`` and ``seed`` reuses
        the subset models and members (``trainings`` in the result counts what one trained).
        """
        return self._submit("/evaluate/attribution", _body(dict(locals())), idempotency_key)

    def evaluate_mislabel(
        self, *,
        dataset: str | NotGiven = NOT_GIVEN,
        recipe: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        estimators: Sequence[str] | NotGiven = NOT_GIVEN,
        fraction: float | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Mislabel detection: replace the tail of a seeded ``fraction`` (default 0.1) of the training triples,
        train ``recipe`` on the corrupted graph, and rank the training triples by each estimator's
        self-influence. The result has each estimator's AUC, the fraction of corrupted triples found after
        inspecting 10% and 20% of the data, the recall curve, and the corrupted triples (``corrupted.tsv``).
        Server default: ``estimators=["tracin", "tracin_last", "trak", "graddot", "gradcos", "random"]`` (no
        ensemble estimators: one model of the corrupted graph is trained).
        """
        return self._submit("/evaluate/mislabel", _body(dict(locals())), idempotency_key)

    def evaluate_classifier_attribution(
        self, *, model: str, dataset: str,
        recipe: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        estimators: Sequence[str] | NotGiven = NOT_GIVEN,
        m: int | NotGiven = NOT_GIVEN,
        alpha: float | NotGiven = NOT_GIVEN,
        n_test: int | NotGiven = NOT_GIVEN,
        ensemble: int | NotGiven = NOT_GIVEN,
        replicates: bool | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        shard_retries: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """The LDS of the classifier data-attribution estimators on an exported or Hugging Face classifier (queue
        ``bulk``).

        ``m`` models are trained by ``recipe`` (``epochs``, ``batch_size``, ``optimizer``, ``lr``, ``momentum``,
        ``weight_decay``, ``checkpoint_every``, ``max_length``, ``seed``) from ``model``'s own weights on random ``alpha``-subsets
        of ``dataset``'s training examples (one shard each), and each estimator's scores on the full-data model
        predict their margins on ``n_test`` test examples: each estimator's LDS per test example, its mean with a
        95% bootstrap interval, its ratio to TracIn's. Server defaults: ``m=32``, ``alpha=0.5``, ``n_test=100``,
        ``estimators=["tracin", "trak", "graddot", "random"]``, ``ensemble=4`` (``trak_ensemble``'s further
        models). ``replicates=True`` reports the ``noise_ceiling``. A later evaluation of the same model, recipe,
        data, ``alpha``, ``m`` and ``seed`` reuses the stored models.
        """
        return self._submit("/evaluate/classifier/attribution", _body(dict(locals())), idempotency_key)

    def evaluate_classifier_mislabel(
        self, *, model: str, dataset: str,
        recipe: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        estimators: Sequence[str] | NotGiven = NOT_GIVEN,
        fraction: float | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Mislabel detection on an exported or Hugging Face classifier: flip a seeded ``fraction`` (default 0.1) of the training
        labels to another class, train ``recipe`` on them, rank the training examples by each estimator's
        self-influence: each estimator's ROC AUC with a 95% bootstrap interval, found@10%/20%, the recall curve.
        Server default: ``estimators=["tracin", "trak", "random"]``.
        """
        return self._submit("/evaluate/classifier/mislabel", _body(dict(locals())), idempotency_key)

    def featurize(
        self, *, model: str,
        checkpoints: Literal["all"] | Sequence[str] | NotGiven = NOT_GIVEN,
        layers: Literal["all", "last"] | Sequence[str] | NotGiven = NOT_GIVEN,
        loss: Literal["train", "score_bce", "margin"] | NotGiven = NOT_GIVEN,
        proj_dim: int | None | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Store the projected gradient features of a ConvE model's training triples (queue ``bulk``; your own
        model only), so that :meth:`tracin` with ``estimator="trak"`` or ``"tracin_projected"`` scores against
        them. Only rows not stored yet are computed. Server defaults: ``checkpoints="all"``, ``layers="all"``,
        ``loss="margin"``, ``proj_dim`` the evaluated TRAK's (4,096, less on graphs whose features would pass
        2 GiB), ``seed=0``: the features a default ``trak`` query reads.
        """
        return self._submit("/featurize", _body(dict(locals())), idempotency_key)

    def classifier_featurize(
        self, *, model: str,
        dataset: str | None | NotGiven = NOT_GIVEN,
        loss: Literal["margin", "train"] | NotGiven = NOT_GIVEN,
        proj_dim: int | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        checkpoints: Literal["all", "last"] | NotGiven = NOT_GIVEN,
        max_length: int | NotGiven = NOT_GIVEN,
        batch_size: int | None | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Store the projected gradient features of a classifier's training examples (``POST
        /featurize/classifier``, queue ``bulk``; your own model only), so that :meth:`classifier_influence` with
        ``stored=True`` (``estimator="trak"`` for ``loss="margin"``, ``"tracin_projected"`` for ``loss="train"``)
        scores against them in one tiled pass. Only rows not stored yet are computed. Server defaults:
        ``loss="margin"``, ``proj_dim=2048``, ``seed=0``, ``checkpoints="all"``, ``max_length=128``.
        """
        return self._submit("/featurize/classifier", _body(dict(locals())), idempotency_key)

    def train_bdh(
        self, *,
        dataset: Literal["digits", "cifar10", "cifar100"] | NotGiven = NOT_GIVEN,
        data_dir: str | None | NotGiven = NOT_GIVEN,
        epochs: int | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        grad_accum_steps: int | NotGiven = NOT_GIVEN,
        lr: float | NotGiven = NOT_GIVEN,
        weight_decay: float | NotGiven = NOT_GIVEN,
        warmup_steps: int | NotGiven = NOT_GIVEN,
        model: Mapping[str, Any] | NotGiven = NOT_GIVEN,
        compile: Literal["off", "default", "max-autotune"] | NotGiven = NOT_GIVEN,
        precision: Precision | NotGiven = NOT_GIVEN,
        deterministic: bool | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        resume_from: str | None | NotGiven = NOT_GIVEN,
        val_fraction: float | NotGiven = NOT_GIVEN,
        max_train_samples: int | None | NotGiven = NOT_GIVEN,
        augment: bool | NotGiven = NOT_GIVEN,
        num_workers: int | None | NotGiven = NOT_GIVEN,
        register_as: str | None | NotGiven = NOT_GIVEN,
        keep_checkpoints: Literal["last_best", "all"] | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Train a Vision-BDH image classifier (queue ``train``); ``metrics.history`` grows while it runs.

        ``model`` is the architecture ``{"n_layer", "n_embd", "n_head", "mlp_multiplier", "dropout", ...}``.
        Server defaults: ``dataset="digits"``, ``epochs=10``, ``batch_size=64``, ``lr=1e-3``. ``resume_from``
        continues an earlier train_bdh job from its checkpoint. ``keep_checkpoints="last_best"`` (default) keeps
        the resumable last checkpoint and the best weights; ``"all"`` also every epoch's weights.
        """
        return self._submit("/train/bdh", _body(dict(locals())), idempotency_key)

    def train_conve(
        self, *, name: str,
        dataset: str | NotGiven = NOT_GIVEN,
        epochs: int | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        lr: float | NotGiven = NOT_GIVEN,
        lr_decay: float | NotGiven = NOT_GIVEN,
        weight_decay: float | NotGiven = NOT_GIVEN,
        label_smoothing: float | NotGiven = NOT_GIVEN,
        embedding_dim: int | NotGiven = NOT_GIVEN,
        embedding_height: int | None | NotGiven = NOT_GIVEN,
        num_filters: int | NotGiven = NOT_GIVEN,
        input_dropout: float | NotGiven = NOT_GIVEN,
        feature_dropout: float | NotGiven = NOT_GIVEN,
        hidden_dropout: float | NotGiven = NOT_GIVEN,
        reciprocal: bool | NotGiven = NOT_GIVEN,
        checkpoint_every: int | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        overwrite: bool | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Train ConvE on knowledge-graph triples with TracIn checkpoints and register it as ``name``.

        Server defaults: ``dataset="nations"``, ``epochs=20``, ``embedding_dim=200``, ``checkpoint_every=5``.
        The result carries filtered MRR and Hits@1/3/10 and the per-epoch ``history``.
        """
        return self._submit("/train/conve", _body(dict(locals())), idempotency_key)

    def train_classifier(
        self, *, name: str, model: str, dataset: str,
        epochs: int | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        optimizer: Literal["sgd", "adam", "adamw"] | None | NotGiven = NOT_GIVEN,
        lr: float | None | NotGiven = NOT_GIVEN,
        momentum: float | NotGiven = NOT_GIVEN,
        weight_decay: float | NotGiven = NOT_GIVEN,
        max_length: int | NotGiven = NOT_GIVEN,
        checkpoint_every: int | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        overwrite: bool | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Train the exported classifier ``model`` from its own weights on the tensors dataset ``dataset``
        (``train.safetensors`` with ``inputs`` and ``labels``), or fine-tune the Hugging Face classifier ``model`` on
        the text dataset ``dataset`` (``train.csv`` / ``train.jsonl`` with ``text`` and ``label``); the valid split
        is scored every epoch. Registers it as ``name`` with its checkpoints (``POST /train/classifier``). Server
        defaults: ``epochs=5``, ``batch_size=64``, ``optimizer`` and ``lr`` by the model (``"sgd"`` with momentum 0.9
        at 0.05 for an exported program, ``"adamw"`` at 5e-5 for a Hugging Face model), ``max_length=128`` tokens,
        ``checkpoint_every=1``, ``seed=0``.
        """
        return self._submit("/train/classifier", _body(dict(locals())), idempotency_key)

    def classifier_influence(
        self, *, model: str,
        dataset: str | None | NotGiven = NOT_GIVEN,
        mode: Literal["test", "self"] | NotGiven = NOT_GIVEN,
        inputs: Sequence[Mapping[str, Any]] | None | NotGiven = NOT_GIVEN,
        texts: Sequence[Mapping[str, Any]] | None | NotGiven = NOT_GIVEN,
        test_indices: Sequence[int] | None | NotGiven = NOT_GIVEN,
        test_split: Literal["train", "valid", "test"] | NotGiven = NOT_GIVEN,
        top_k: int | NotGiven = NOT_GIVEN,
        estimator: Literal["tracin", "tracin_projected", "trak", "trak_ensemble", "ekfac"] | NotGiven = NOT_GIVEN,
        output: Literal["loss", "margin"] | None | NotGiven = NOT_GIVEN,
        method: Literal["ghost", "vmap"] | NotGiven = NOT_GIVEN,
        ensemble: Sequence[str] | None | NotGiven = NOT_GIVEN,
        stored: bool | NotGiven = NOT_GIVEN,
        proj_dim: int | NotGiven = NOT_GIVEN,
        projection: Literal["kronecker", "dense"] | NotGiven = NOT_GIVEN,
        damping: float | NotGiven = NOT_GIVEN,
        ekfac_damping: float | None | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        checkpoints: Literal["all", "last"] | NotGiven = NOT_GIVEN,
        max_length: int | NotGiven = NOT_GIVEN,
        batch_size: int | None | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """TracIn-CP on a classifier the service trained (``POST /tracin/classifier``): with ``mode="test"``
        (default) each test example's ``top_k`` proponents and opponents among the training examples of
        ``dataset`` (by default the one the model was trained on); the test examples are ``inputs`` of an exported
        classifier (``[{"id", "values", "target"?}]``) or ``texts`` of a Hugging Face one (``[{"id", "text",
        "target"?}]``), ``target`` the class whose loss is traced (by default the predicted one), or
        ``test_indices`` of the dataset's ``test_split``. ``mode="self"`` ranks the training examples by
        self-influence (suspected mislabels first; the full ranking is the artifact ``self_influence.csv``).
        ``estimator="trak"`` gives TRAK (margin gradients projected to ``proj_dim``, the damped Gauss-Newton
        inverse, ``seed`` of the projection) instead of exact TracIn-CP; ``"trak_ensemble"`` averages TRAK over
        this model and the models named in ``ensemble``; ``"tracin_projected"`` is TracIn with projected
        gradients; ``"ekfac"`` gives influence functions with EK-FAC curvature through Kronfluence at the trained
        model (``ekfac_damping``: Kronfluence's damping factor, by default its heuristic), over the model's linear
        and convolution layers (an exported program without such calls is refused with the reason). ``output``:
        what the test side differentiates (``"loss"`` or ``"margin"``); ``method="vmap"`` makes TracIn
        materialise every gradient instead of factorising linear layers; ``stored=True`` scores trak or
        tracin_projected against the features ``classifier_featurize`` stored; ``projection="dense"`` projects
        trak, trak_ensemble and tracin_projected with one dense Gaussian matrix instead of the per-layer Kronecker
        product (lower variance, more memory; not with ``stored``). Server defaults: ``top_k=10``,
        ``estimator="tracin"``, ``output`` loss for tracin and tracin_projected and margin otherwise,
        ``method="ghost"``, ``proj_dim=2048``, ``damping=0.01``, ``checkpoints="all"``, ``max_length=128`` tokens,
        ``batch_size`` as many training examples' gradients as fit 256 MiB.
        """
        return self._submit("/tracin/classifier", _body(dict(locals())), idempotency_key)

    def ablations(
        self, *, dataset: str,
        representations: Sequence[str] | Literal["all"] | NotGiven = NOT_GIVEN,
        layer_sets: Sequence[Literal["all", "visual", "text"]] | NotGiven = NOT_GIVEN,
        num_runs: int | NotGiven = NOT_GIVEN,
        n_splits: int | None | NotGiven = NOT_GIVEN,
        quick: bool | NotGiven = NOT_GIVEN,
        sample_layers: float | NotGiven = NOT_GIVEN,
        cache_features: bool | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        max_epochs: int | NotGiven = NOT_GIVEN,
        patience: int | NotGiven = NOT_GIVEN,
        hidden_dim: int | NotGiven = NOT_GIVEN,
        dropout: float | NotGiven = NOT_GIVEN,
        weight_decay: float | NotGiven = NOT_GIVEN,
        precision: Precision | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """The LoRA weight-space ablation: probe a LoRA's concept from all layers vs visual-only layers.

        Server defaults: ``representations="all"``, ``layer_sets=["all", "visual"]``, ``num_runs=10``
        (``quick=True``: 3 runs); ``n_splits`` distinct seeded data splits over the runs (default a new split
        per run). The result has mean ± std per representation and layer set, and the drop.
        """
        return self._submit("/ablations", _body(dict(locals())), idempotency_key)

    def train_news(
        self, *, name: str, dataset: str,
        architecture: Literal["nrms", "naml"] | NotGiven = NOT_GIVEN,
        encoder: Literal["minilm", "pretrained", "word"] | NotGiven = NOT_GIVEN,
        pretrained_path: str | None | NotGiven = NOT_GIVEN,
        fine_tune_layers: int | NotGiven = NOT_GIVEN,
        glove_path: str | None | NotGiven = NOT_GIVEN,
        embedding_dim: int | NotGiven = NOT_GIVEN,
        heads: int | NotGiven = NOT_GIVEN,
        head_dim: int | NotGiven = NOT_GIVEN,
        query_dim: int | NotGiven = NOT_GIVEN,
        filters: int | NotGiven = NOT_GIVEN,
        window: int | NotGiven = NOT_GIVEN,
        dropout: float | NotGiven = NOT_GIVEN,
        train_split: Literal["train", "valid", "test"] | NotGiven = NOT_GIVEN,
        valid_split: Literal["train", "valid", "test"] | None | NotGiven = NOT_GIVEN,
        npratio: int | NotGiven = NOT_GIVEN,
        max_title_len: int | NotGiven = NOT_GIVEN,
        max_body_len: int | NotGiven = NOT_GIVEN,
        max_history: int | NotGiven = NOT_GIVEN,
        epochs: int | NotGiven = NOT_GIVEN,
        lr: float | NotGiven = NOT_GIVEN,
        batch_size: int | NotGiven = NOT_GIVEN,
        seed: int | NotGiven = NOT_GIVEN,
        precision: Precision | NotGiven = NOT_GIVEN,
        resume: bool | NotGiven = NOT_GIVEN,
        overwrite: bool | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Train an NRMS or NAML news recommender on MIND-format data and register it as ``name`` (queue
        ``train``); MIND metrics per epoch in ``metrics.history``, checkpoints, ``resume``.

        ``dataset`` is a registered news dataset (``client.datasets.register``), a directory under the data
        roots holding ``{train,valid}/`` MIND splits or ``pairs_{split}.csv``, or one pairwise CSV file (then
        ``valid_split=None``). ``encoder``: ``"minilm"`` (shipped), ``"pretrained"`` (a BERT-family directory
        ``pretrained_path``; ``fine_tune_layers`` trains its last k layers), or ``"word"`` embeddings (from
        scratch, or from the GloVe file ``glove_path`` of dimension ``embedding_dim``); NAML uses ``"word"``.
        Server defaults: ``architecture="nrms"``, ``encoder="minilm"``, ``heads=16``, ``head_dim=16``,
        ``query_dim=200``, ``filters=256``, ``window=3`` (NAML), ``dropout=0.2``, ``train_split="train"``,
        ``valid_split="valid"``, ``npratio=4``, ``max_title_len=30``, ``max_body_len=60``, ``max_history=50``,
        ``epochs=3``, ``lr=1e-3``, ``batch_size=32``, ``seed=0``, ``precision="auto"``. ``resume=True``
        continues your latest checkpointed run of ``name`` (same model fields); ``overwrite=True`` replaces
        your model of that name.
        """
        return self._submit("/train/news", _body(dict(locals())), idempotency_key)

    def import_model(
        self, *, name: str, kind: Literal["conve", "nrms", "naml", "vision_bdh", "huggingface", "export"], path: str,
        weights: str | None | NotGiven = NOT_GIVEN,
        config: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        entities: str | None | NotGiven = NOT_GIVEN,
        relations: str | None | NotGiven = NOT_GIVEN,
        reciprocal: bool | None | NotGiven = NOT_GIVEN,
        train_triples: str | None | NotGiven = NOT_GIVEN,
        valid_triples: str | None | NotGiven = NOT_GIVEN,
        test_triples: str | None | NotGiven = NOT_GIVEN,
        checkpoints: Sequence[Mapping[str, Any]] | NotGiven = NOT_GIVEN,
        vocab: str | None | NotGiven = NOT_GIVEN,
        overwrite: bool | NotGiven = NOT_GIVEN,
        label: str | None | NotGiven = NOT_GIVEN,
        tags: Sequence[str] | NotGiven = NOT_GIVEN,
        requirements: Mapping[str, Any] | None | NotGiven = NOT_GIVEN,
        idempotency_key: str | None = None,
        **extra: Any,
    ) -> R:
        """Register a model trained elsewhere (``POST /models/import``) as ``name``: ConvE, NRMS/NAML or
        Vision-BDH weights, or a Hugging Face sequence classifier (``kind="huggingface"``: config.json,
        model.safetensors and tokenizer.json, as ``save_pretrained`` writes them), or any classifier exported with
        ``torch.export`` (``kind="export"``: ``weights`` the ``.pt2`` archive, default ``model.pt2``; ``config`` its
        spec ``{"input": {"kind": "image" | "tabular", "features"?, "mean"?}, "labels"?}``, default the directory's
        ``spec.json``), in the directory ``path`` under the data roots.

        The job checks every tensor's name and shape against the config before registering, and reports the
        parameters and a smoke score. File names are relative to ``path``: ``weights`` (default the first of
        ``model.safetensors``, ``model.pt``, ``model.pth``, ``pytorch_model.bin``; ``.pt`` files are read with
        ``weights_only``), ``config`` (default the directory's ``config.json``). ConvE: ``entities`` and
        ``relations`` (the id tables, found by name when left out), ``reciprocal`` (default from the relation
        table), ``train_triples`` (default ``train.txt``), ``valid_triples``, ``test_triples``, and the TracIn
        ``checkpoints`` ``[{"file", "lr", "epoch"?}]``. NRMS/NAML word models: ``vocab`` (default
        ``vocab.json``). ``overwrite=True`` replaces your model of that name.
        """
        return self._submit("/models/import", _body(dict(locals())), idempotency_key)
