# The planning service: `autopar serve` on SQLite (a volume at /data) by default, PostgreSQL when
# AUTOPAR_DATABASE_URL says so. No torch: the image installs only the `api` extra.
#   docker build -t autopar .
#   docker run -p 8000:8000 -v autopar-data:/data autopar
#   docker run --rm -v autopar-data:/data autopar autopar tokens create --name alice
#   docker run -p 8000:8000 -e AUTOPAR_DATABASE_URL=postgresql+psycopg://user:pass@db:5432/autopar autopar
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AUTOPAR_DATABASE_URL=sqlite:////data/autopar.db

WORKDIR /src
COPY pyproject.toml README.md ./
COPY autopar ./autopar
COPY model_specs ./model_specs
COPY cluster_specs ./cluster_specs
COPY cost_models ./cost_models
COPY planner ./planner
COPY runtime ./runtime
COPY api ./api
COPY agent ./agent
RUN pip install '.[api]' && rm -rf /src \
    && useradd --create-home --uid 10001 autopar && mkdir -p /data && chown autopar /data

USER autopar
WORKDIR /home/autopar
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)"
CMD ["autopar", "serve", "--host", "0.0.0.0", "--port", "8000"]
