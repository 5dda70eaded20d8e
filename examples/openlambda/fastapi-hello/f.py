"""A FastAPI app: lifespan startup runs once per sandbox, path parameters, JSON bodies, a
status and header of its own, and an exception that becomes a 500 with its traceback."""
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from pydantic import BaseModel

started = []


@asynccontextmanager
async def lifespan(app):
    started.append("startup")
    yield {"greeting": "hello"}


app = FastAPI(lifespan=lifespan)


class Item(BaseModel):
    name: str
    price: float


@app.api_route("/", methods=["GET", "POST"])
async def root():
    return {"hello": "world"}


@app.get("/hello/{name}")
async def hello(name: str, shout: bool = False):
    text = f"hello, {name}"
    return {"message": text.upper() if shout else text, "startups": len(started)}


@app.post("/items", status_code=201)
async def create(item: Item, response: Response):
    response.headers["X-Item"] = item.name
    return {"name": item.name, "price_with_tax": round(item.price * 1.2, 2)}


@app.get("/boom")
async def boom():
    raise RuntimeError("the app failed on purpose")
