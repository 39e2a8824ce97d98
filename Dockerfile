# The planner service image: one process, SQLite by default, PostgreSQL via DATABASE_URL.
#   docker build -t planner .
#   docker run -p 8000:8000 -e DATABASE_URL=postgresql+psycopg://user@db:5432/planner planner
# With PostgreSQL, run `planner db upgrade` once (same image) before starting replicas, and
# `planner worker` containers for long searches.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY cost_model ./cost_model
COPY planner_service ./planner_service
RUN pip install . && useradd --create-home planner
USER planner
WORKDIR /home/planner
ENV DATABASE_URL=sqlite:////home/planner/planner.db
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz').status == 200 else 1)"
CMD ["planner", "serve", "--host", "0.0.0.0", "--port", "8000"]
