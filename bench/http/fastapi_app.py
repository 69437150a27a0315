"""The baseline: the same two workloads served by FastAPI + uvicorn with the same KServe v2 JSON
requests and responses, as a Python team would write it. Run by bench_http.py."""

import os
import sys

from fastapi import FastAPI, Request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402  (the same file the Orochi models run)

app = FastAPI()


@app.post("/v2/models/identity/infer")
async def identity(request: Request):
    body = await request.json()
    x = body["inputs"][0]
    return {"model_name": "identity", "model_version": "1",
            "outputs": [{"name": "y", "datatype": "FP32", "shape": x["shape"],
                         "data": workload.identity(x["data"])}]}


@app.post("/v2/models/wordcount/infer")
async def wordcount(request: Request):
    body = await request.json()
    text = body["inputs"][0]["data"][0]
    return {"model_name": "wordcount", "model_version": "1",
            "outputs": [{"name": "score", "datatype": "FP64", "shape": [1],
                         "data": [workload.text_score(text)]}]}
