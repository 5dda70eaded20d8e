"""A Starlette app that reads its request body as a stream and answers with a streamed
response, with lifespan state."""
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route


@asynccontextmanager
async def lifespan(app):
    yield {"chunk_words": ["one", "two", "three"]}


async def upload(request):
    chunks, size = 0, 0
    async for chunk in request.stream():
        if chunk:
            chunks += 1
            size += len(chunk)
    return JSONResponse({"chunks": chunks, "bytes": size})


async def words(request):
    async def produce():
        for word in request.state.chunk_words:
            yield (word + "\n").encode()

    return StreamingResponse(produce(), media_type="text/plain", headers={"X-Streamed": "yes"})


app = Starlette(routes=[Route("/upload", upload, methods=["POST"]), Route("/words", words)], lifespan=lifespan)
