# The gradwatch server image: the server's stack only, never torch.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protocol protocol
COPY trainer_hooks trainer_hooks
COPY server server
COPY client client
# [server] holds fastapi, uvicorn, pydantic, plotly, websockets, psycopg; torch is in
# the separate [torch] extra, so this install cannot pull it.
RUN pip install --no-cache-dir ".[server]"
RUN useradd --create-home gradwatch && mkdir /data && chown gradwatch /data
USER gradwatch
VOLUME ["/data"]
EXPOSE 8765
# Inside the container the server must listen on all interfaces to be reachable
# through the published port, which the server allows only with a token.
CMD ["sh", "-c", "gradwatch serve --host 0.0.0.0 --port 8765 --db /data/gradwatch.db --token \"$GRADWATCH_TOKEN\" --view-token \"$GRADWATCH_VIEW_TOKEN\""]
