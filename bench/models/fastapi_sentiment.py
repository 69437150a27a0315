"""The baseline for bench_models.py: the sentiment example served by FastAPI + uvicorn.

It loads the staged package (build/models/sentiment/package) through models/torch_runner.py,
so the model code is the very code Orochi runs, on PyTorch instead, and answers the same
KServe v2 JSON requests on the same route. uvicorn imports this module once per worker, so
every worker holds its own copy of the model. OROCHI_BENCH_SENTIMENT_PACKAGE overrides the
package directory.
"""

import os
import sys
from pathlib import Path

import torch
from fastapi import FastAPI, HTTPException, Request

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(os.environ.get("OROCHI_BENCH_SENTIMENT_PACKAGE",
                              ROOT / "build" / "models" / "sentiment" / "package"))

sys.path.insert(0, str(ROOT / "models"))
from torch_runner import InputError, TorchModel  # noqa: E402

# One intra-op thread per worker, as each Orochi copy has: N workers then compete for N cores
# the way N copies do, instead of every worker spreading over all of them.
torch.set_num_threads(1)

MODEL = TorchModel(PACKAGE)
NAME = MODEL.manifest["name"]
VERSION = str(MODEL.manifest["version"])
DATATYPES = {output["name"]: output["datatype"] for output in MODEL.manifest["outputs"]}

app = FastAPI()


@app.post(f"/v2/models/{NAME}/infer")
async def infer(request: Request):
    body = await request.json()
    try:
        outputs = MODEL.infer(body)
    except (InputError, KeyError, TypeError, ValueError) as error:
        raise HTTPException(status_code=400, detail=str(error)) from None
    return {"model_name": NAME, "model_version": VERSION,
            "outputs": [{"name": name, "datatype": DATATYPES[name], "shape": shape, "data": data}
                        for name, (shape, data) in outputs.items()]}
