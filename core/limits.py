"""Upper bounds on every count, size and string of every request: one table, each bound named, with its reason.

The request schemas (``core/kinds/*.py``, ``POST /datasets``) apply these as ``Field(le=...)`` /
``Field(max_length=...)``, so a request over a bound is a 422 naming the field before anything is queued, and the
OpenAPI schema states every bound. Bounds that depend on two fields or on the model (a TracIn request's listed
pairs, a training run's memory: :mod:`core.memory`) are checked by the kinds' ``validate`` functions.

``docs/operations.md`` ("Limits") lists them with their defaults; ``tests/adversarial/test_numbers.py`` checks that
every field a limit names carries it, that every count, size and string of every request has some bound, and that
the documentation lists every limit. No torch, no FastAPI.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    name: str
    value: int
    fields: tuple[str, ...]  # "<kind>.<field>" (nested: "<kind>.<object>.<field>", list items: "<field>[]")
    reason: str


LIMITS: dict[str, Limit] = {}


def _limit(name: str, value: int, fields: tuple[str, ...], reason: str) -> int:
    LIMITS[name] = Limit(name, value, fields, reason)
    return value


# ------------------------------------------------------------------------------------------ names, paths, texts

MAX_NAME_LENGTH = _limit(
    "MAX_NAME_LENGTH", 128,
    ("tracin.model", "attributions.model", "attributions.compare_with", "attributions.dataset.name",
     "train_conve.name", "train_news.name", "import_model.name", "train_bdh.register_as", "datasets.name"),
    "a registered model's or dataset's name: the registry's names are at most 128 characters (models a job "
    "trains or imports: 64, by their pattern)")
MAX_PATH_LENGTH = _limit(
    "MAX_PATH_LENGTH", 1024,
    ("tracin.test_triples_path", "train_bdh.data_dir", "import_model.path", "datasets.path",
     "train_news.dataset", "train_news.pretrained_path", "train_news.glove_path", "train_conve.dataset",
     "ablations.dataset"),
    "a path under the data roots (or a registered name where a field takes either): with the data root in front "
    "it stays within Linux's PATH_MAX (4096 bytes); a single component over NAME_MAX (255 bytes) is refused "
    "when the path is resolved")
MAX_FILE_NAME_LENGTH = _limit(
    "MAX_FILE_NAME_LENGTH", 512,
    ("import_model.weights", "import_model.entities", "import_model.relations", "import_model.train_triples",
     "import_model.valid_triples", "import_model.test_triples", "import_model.vocab", "import_model.checkpoints[].file"),
    "a file inside the model directory, sub-directories included")
MAX_TRIPLE_NAME_LENGTH = _limit(
    "MAX_TRIPLE_NAME_LENGTH", 512,
    ("tracin.test_triples[][]", "tracin.train_triples[][]", "tracin.checkpoints[]", "tracin.layers[]"),
    "an entity, relation, checkpoint or layer name, compared with the model's own names")
MAX_JOB_ID_LENGTH = _limit(
    "MAX_JOB_ID_LENGTH", 128, ("train_bdh.resume_from",), "a job id (core.keys.JOB_ID_PATTERN)")
MAX_DESCRIPTION_LENGTH = _limit(
    "MAX_DESCRIPTION_LENGTH", 2000, ("datasets.description",), "a description kept in the registry record")
MAX_SAMPLE_ID_LENGTH = _limit(
    "MAX_SAMPLE_ID_LENGTH", 200, ("attributions.samples[].id", "attributions.texts[].id",
                                    "attributions.inputs[].id"),
    "a sample's id, repeated in every result row")
MAX_TITLE_LENGTH = _limit(
    "MAX_TITLE_LENGTH", 2000, ("attributions.samples[].history[]", "attributions.samples[].candidate"),
    "a news title (tokenised to at most the model's title length anyway)")
MAX_BODY_TEXT_LENGTH = _limit(
    "MAX_BODY_TEXT_LENGTH", 20_000, ("attributions.samples[].candidate_body", "attributions.samples[].history_bodies[]"),
    "a news body (NAML's body view reads its first tokens)")
MAX_TEXT_LENGTH = _limit(
    "MAX_TEXT_LENGTH", 20_000, ("attributions.texts[].text",),
    "a text for a Hugging Face classifier (it reads at most its maximum tokens, 512 for BERT-family models; the "
    "rest is truncated and the record says so)")
MAX_INPUT_VALUES = _limit(
    "MAX_INPUT_VALUES", 3 * 512 * 512, ("attributions.inputs[].values", "attributions.baseline_values"),
    "entries of an exported classifier's input at its outer level (its first dimension: channels or features); "
    "the model's spec bounds the whole input to as many values (models.export.spec.MAX_INPUT_VALUES)")
MAX_CLASS_NAME_LENGTH = _limit(
    "MAX_CLASS_NAME_LENGTH", 200, ("attributions.texts[].label", "attributions.texts[].target",
                                     "attributions.inputs[].label", "attributions.inputs[].target"),
    "a class name of a classifier (config.json's id2label), or a text's own label")
MAX_CONFIG_KEYS = _limit(
    "MAX_CONFIG_KEYS", 256, ("import_model.config",),
    "entries of an imported model's config (a config has tens; the request body limit bounds their values)")
_EVERY_KIND = ("attributions", "tracin", "train_bdh", "train_conve", "train_news", "import_model", "ablations")
MAX_LABEL_LENGTH = _limit(
    "MAX_LABEL_LENGTH", 200, tuple(f"{k}.label" for k in _EVERY_KIND),
    "a job's label, shown in every row of the jobs list and kept in the job's meta (read on every view)")
MAX_TAGS = _limit(
    "MAX_TAGS", 16, tuple(f"{k}.tags" for k in _EVERY_KIND), "a job's tags, kept in the job's meta")
MAX_TAG_LENGTH = _limit(
    "MAX_TAG_LENGTH", 32, tuple(f"{k}.tags[]" for k in _EVERY_KIND), "a tag: a short slug")
MAX_REPRESENTATION_NAME_LENGTH = _limit(
    "MAX_REPRESENTATION_NAME_LENGTH", 64, ("ablations.representations[]",),
    "a representation's name, one of a dozen known ones")

# --------------------------------------------------------------------------------------------------------- seeds

MAX_SEED = _limit(
    "MAX_SEED", 2**31 - 1,
    ("train_conve.seed", "train_news.seed", "train_bdh.seed", "ablations.seed", "attributions.dataset.seed",
     "attributions.faithfulness_seed"),
    "fits every seeding API a job calls (numpy's 32-bit seeds, torch's 64-bit ones, int32 data-loader seeds), "
    "with room for the per-run offsets seed + run")

# -------------------------------------------------------------------------------------------------------- TracIn

MAX_TEST_TRIPLES = _limit(
    "MAX_TEST_TRIPLES", 10_000, ("tracin.test_triples",),
    "test triples per job (also the lines of test_triples_path): every shard holds every test triple's factors")
MAX_SINGLE_TRAIN_TRIPLES = _limit(
    "MAX_SINGLE_TRAIN_TRIPLES", 100_000, ("tracin.train_triples",), "mode 'single': the training triples to score")
MAX_SINGLE_PAIRS = _limit(
    "MAX_SINGLE_PAIRS", 1_000_000, (),
    "mode 'single' returns every (test, train) pair: test triples x train_triples, checked by validate")
MAX_TRACIN_TOP_K = _limit(
    "MAX_TRACIN_TOP_K", 10_000, ("tracin.top_k",),
    "proponents and opponents listed per test triple: the running top-k holds 2 x top_k scores and indices per "
    "test triple, and the lists go into the result (top_k 50,000,000 cost a worker 2.8 GB); top_k null writes "
    "every score to scores.npy instead")
MAX_TRACIN_LISTED = _limit(
    "MAX_TRACIN_LISTED", 1_000_000, (),
    "test triples x top_k: the entries of each of the result's two lists (about 150 bytes each in the result "
    "JSON, kept in Redis), checked by validate; the same budget as mode 'single''s pairs")
MAX_CHECKPOINTS = _limit(
    "MAX_CHECKPOINTS", 1000, ("tracin.checkpoints", "import_model.checkpoints"),
    "checkpoints named by one request (TracIn sums over them; a model has tens)")
MAX_LAYERS = _limit(
    "MAX_LAYERS", 64, ("tracin.layers",), "layer names in one request (ConvE has 21 names to choose from)")
MAX_PROJECTION_DIM = _limit(
    "MAX_PROJECTION_DIM", 16_384, ("tracin.projection_dim",),
    "random projection of the conv features (10,368 wide for ConvE-200; a projection at least as wide is not "
    "applied); the projection matrix is features x projection_dim floats")
MAX_TRACIN_BATCH_SIZE = _limit(
    "MAX_TRACIN_BATCH_SIZE", 16_384, ("tracin.batch_size",),
    "candidate triples per pass: a pass holds batch x entities scores per query direction (FB15k-237: 16,384 x "
    "14,541 x 4 B = 950 MB)")
MAX_HOPS = _limit("MAX_HOPS", 6, ("tracin.filter.n_hops",), "the candidate filter's neighbourhood radius")
MAX_MIN_DEGREE = _limit(
    "MAX_MIN_DEGREE", 1_000_000_000, ("tracin.filter.min_degree",),
    "a degree threshold, compared with int64 tensors (a larger one overflows them and filters nothing more)")

# ------------------------------------------------------------------------------------------------------- fan-out

MAX_SHARD_SIZE = _limit(
    "MAX_SHARD_SIZE", 1_000_000, ("tracin.shard_size", "attributions.shard_size"),
    "items per shard (a shard of more items than a request holds is one job)")
MAX_SHARD_RETRIES = _limit(
    "MAX_SHARD_RETRIES", 5, ("tracin.shard_retries", "attributions.shard_retries"), "retries of a failed shard")

# -------------------------------------------------------------------------------------------------- attributions

MAX_SAMPLES = _limit(
    "MAX_SAMPLES", 20_000, ("attributions.samples", "attributions.texts", "attributions.inputs"),
    "samples given inline (a 20,000-sample body is about the 8 MiB body limit); more come from a dataset")
MAX_DATASET_SAMPLES = _limit(
    "MAX_DATASET_SAMPLES", 1_000_000, ("attributions.dataset.n_samples",),
    "samples drawn from a registered dataset (large runs fan out over the workers)")
MAX_HISTORY = _limit(
    "MAX_HISTORY", 500,
    ("attributions.samples[].history", "attributions.samples[].history_bodies", "attributions.max_history",
     "train_news.max_history"),
    "clicked titles per user (MIND's histories are at most a few hundred)")
MAX_IG_STEPS = _limit(
    "MAX_IG_STEPS", 4096, ("attributions.n_steps",),
    "quadrature nodes per sample; Gauss-Legendre converges in tens")
MAX_ALPHA_BATCH_SIZE = _limit(
    "MAX_ALPHA_BATCH_SIZE", 4096, ("attributions.alpha_batch_size",),
    "alphas per batched pass (more than n_steps are never used)")
MAX_IG_BATCH_SIZE = _limit(
    "MAX_IG_BATCH_SIZE", 4096, ("attributions.batch_size",), "samples per batched pass")
MAX_IG_ROWS_PER_PASS = _limit(
    "MAX_IG_ROWS_PER_PASS", 65_536, (),
    "alpha_batch_size x batch_size interpolated rows in one pass, when both are given (checked by validate); "
    "'auto' sizes passes from the model's measured memory per row instead")
MAX_CLASS_INDEX = _limit(
    "MAX_CLASS_INDEX", 9_999, ("attributions.texts[].target",),
    "a class index of a classifier: the service loads classifiers of at most 10,000 classes "
    "(models.hf.files.MAX_LABELS)")
MAX_ATTRIBUTION_TOP_K = _limit(
    "MAX_ATTRIBUTION_TOP_K", 200, ("attributions.top_k",), "words listed per sample (a title has tens)")
MAX_COMPARE_TOP_N = _limit(
    "MAX_COMPARE_TOP_N", 200, ("attributions.compare_top_n",), "changed words marked per sample in a comparison "
    "(a title has tens)")
MAX_COMPARE_MIN_COUNT = _limit(
    "MAX_COMPARE_MIN_COUNT", 1_000_000, ("attributions.compare_min_count",),
    "occurrences a word needs to enter a comparison's table (at most the words of the samples)")

# ------------------------------------------------------------------------------------------------------ training

MAX_EPOCHS = _limit(
    "MAX_EPOCHS", 10_000,
    ("train_conve.epochs", "train_conve.checkpoint_every", "train_bdh.epochs", "train_news.epochs",
     "ablations.max_epochs", "ablations.patience"),
    "epochs of one run (the kind's timeout ends a run long before)")
MAX_TRAIN_BATCH_SIZE = _limit(
    "MAX_TRAIN_BATCH_SIZE", 65_536, ("train_conve.batch_size", "ablations.batch_size"),
    "examples per optimiser step; the memory a batch needs is estimated separately (core.memory)")
MAX_EMBEDDING_DIM = _limit(
    "MAX_EMBEDDING_DIM", 4096, ("train_conve.embedding_dim", "train_conve.embedding_height", "train_bdh.model.n_embd"),
    "an embedding width; with the other sizes it is bounded by the memory estimate too")
MAX_CONVE_FILTERS = _limit(
    "MAX_CONVE_FILTERS", 1024, ("train_conve.num_filters",),
    "ConvE's convolution filters; the fully connected layer grows with filters x embedding_dim^2")
MAX_BDH_LAYERS = _limit("MAX_BDH_LAYERS", 64, ("train_bdh.model.n_layer",), "applications of the shared BDH layer")
MAX_BDH_HEADS = _limit("MAX_BDH_HEADS", 128, ("train_bdh.model.n_head",), "BDH attention heads")
MAX_BDH_MLP_MULTIPLIER = _limit(
    "MAX_BDH_MLP_MULTIPLIER", 512, ("train_bdh.model.mlp_multiplier",), "BDH neurons per embedding dimension")
MAX_BDH_BATCH_SIZE = _limit("MAX_BDH_BATCH_SIZE", 8192, ("train_bdh.batch_size",), "images per step")
MAX_GRAD_ACCUM_STEPS = _limit("MAX_GRAD_ACCUM_STEPS", 1024, ("train_bdh.grad_accum_steps",), "steps per update")
MAX_WARMUP_STEPS = _limit("MAX_WARMUP_STEPS", 10_000_000, ("train_bdh.warmup_steps",), "learning-rate warm-up steps")
MAX_TRAIN_SAMPLES = _limit(
    "MAX_TRAIN_SAMPLES", 100_000_000, ("train_bdh.max_train_samples",),
    "a cap on the training images used (more than the dataset holds means all of them)")
MAX_DATA_WORKERS = _limit("MAX_DATA_WORKERS", 64, ("train_bdh.num_workers",), "DataLoader processes")
MAX_NEWS_EMBEDDING_DIM = _limit(
    "MAX_NEWS_EMBEDDING_DIM", 1024, ("train_news.embedding_dim", "train_news.query_dim"),
    "word-embedding and additive-attention query sizes")
MAX_NEWS_HEADS = _limit("MAX_NEWS_HEADS", 64, ("train_news.heads",), "NRMS attention heads")
MAX_NEWS_HEAD_DIM = _limit("MAX_NEWS_HEAD_DIM", 256, ("train_news.head_dim",), "NRMS size per head")
MAX_NEWS_FILTERS = _limit("MAX_NEWS_FILTERS", 2048, ("train_news.filters",), "NAML CNN filters")
MAX_NEWS_WINDOW = _limit("MAX_NEWS_WINDOW", 9, ("train_news.window",), "NAML CNN window")
MAX_FINE_TUNE_LAYERS = _limit(
    "MAX_FINE_TUNE_LAYERS", 96, ("train_news.fine_tune_layers",), "transformer layers trained (BERT-large has 24)")
MAX_NPRATIO = _limit("MAX_NPRATIO", 64, ("train_news.npratio",), "non-clicked candidates per click")
MAX_TITLE_TOKENS = _limit("MAX_TITLE_TOKENS", 512, ("train_news.max_title_len",), "tokens per title")
MAX_BODY_TOKENS = _limit("MAX_BODY_TOKENS", 1024, ("train_news.max_body_len",), "tokens per body (NAML)")
MAX_NEWS_BATCH_SIZE = _limit("MAX_NEWS_BATCH_SIZE", 4096, ("train_news.batch_size",), "impressions per step")
MAX_NEWS_TOKENS_PER_BATCH = _limit(
    "MAX_NEWS_TOKENS_PER_BATCH", 4_000_000, (),
    "tokens one training step encodes: batch_size x (max_history + 1 + npratio) x (max_title_len, + max_body_len "
    "for NAML), checked by validate; the defaults encode 52,800 and a transformer encoder keeps activations per "
    "token")
MAX_PROBE_RUNS = _limit(
    "MAX_PROBE_RUNS", 100, ("ablations.num_runs", "ablations.n_splits"), "probe runs per cell / data splits")
MAX_PROBE_HIDDEN = _limit("MAX_PROBE_HIDDEN", 16_384, ("ablations.hidden_dim",), "the probe MLP's hidden width")

# ------------------------------------------------------------------------------------------ attribution evaluation
MAX_EVAL_MODELS = _limit(
    "MAX_EVAL_MODELS", 256, ("evaluate_attribution.m", "evaluate_classifier_attribution.m"),
    "subset models one LDS evaluation trains (each one a ConvE training run, one shard; the TRAK paper's figures "
    "use 50 to a few hundred)")
MAX_EVAL_EPOCHS = _limit(
    "MAX_EVAL_EPOCHS", 200, ("evaluate_attribution.recipe.epochs", "evaluate_mislabel.recipe.epochs",
                         "evaluate_classifier_attribution.recipe.epochs", "evaluate_classifier_mislabel.recipe.epochs"),
    "epochs of each model an evaluation trains (an evaluation trains up to MAX_EVAL_MODELS + 1 of them)")
MAX_EVAL_TRAINING_EPOCHS = _limit(
    "MAX_EVAL_TRAINING_EPOCHS", 20_000, (),
    "(m + ensemble members) x recipe.epochs of one LDS evaluation (the epochs its subset models and ensemble "
    "members train in all; the classifier evaluations also count the full-data model), checked by validate")
MAX_EVAL_ENSEMBLE = _limit(
    "MAX_EVAL_ENSEMBLE", 16, ("evaluate_attribution.ensemble", "evaluate_classifier_attribution.ensemble"),
    "further full-data models an LDS evaluation trains for the ensemble estimators (trak_ensemble; each one a "
    "ConvE training run, one shard)")
MAX_EVAL_TEST_TRIPLES = _limit(
    "MAX_EVAL_TEST_TRIPLES", 2000, ("evaluate_attribution.n_test", "evaluate_classifier_attribution.n_test"),
    "test triples an LDS evaluation scores (the estimators compute n_test x training-triples scores, and the "
    "result lists one LDS per test triple and estimator)")
MAX_EVAL_ESTIMATORS = _limit(
    "MAX_EVAL_ESTIMATORS", 16, ("evaluate_attribution.estimators", "evaluate_mislabel.estimators",
                            "evaluate_classifier_attribution.estimators", "evaluate_classifier_mislabel.estimators"),
    "estimators one evaluation measures (each name at most once)")
