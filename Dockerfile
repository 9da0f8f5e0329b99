# The gradwatch server image: the server's stack only, never torch.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY trainer_hooks trainer_hooks
COPY server server
COPY client client
COPY integrations integrations
COPY notebook notebook
# [server] holds fastapi, uvicorn, pydantic, plotly, websockets, psycopg; torch is in
# the separate [torch] extra, so this install cannot pull it.
RUN pip install --no-cache-dir ".[server]"
RUN useradd --create-home gradwatch && mkdir /data && chown gradwatch /data
USER gradwatch
VOLUME ["/data"]
EXPOSE 8765
# Settings come from GRADWATCH_* variables (docker-compose.yml sets them): the
# database (SQLite on the volume, or GRADWATCH_DB=postgresql://...), the tokens.
# Inside the container the server must listen on all interfaces to be reachable
# through the published port; gradwatch serve allows that only with a token.
ENV GRADWATCH_HOST=0.0.0.0 GRADWATCH_PORT=8765 GRADWATCH_DB=/data/gradwatch.db
CMD ["gradwatch", "serve"]
