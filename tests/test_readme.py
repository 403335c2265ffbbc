"""The README's code block runs as written (issue 27, item 5): on the README's own example model, with `gm` a real
joint graph; the compile lines compile, run forward and backward, and explain what torch.compile compiled. On a GPU
(`tools/gpu_check.sh` runs this file) the same block runs with the model and input on CUDA."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.:FutureWarning")
README = Path(__file__).resolve().parents[1] / "README.md"
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_the_readme_block_runs_as_written(device, tmp_path, monkeypatch, capsys):
    from streamnb.examples import running_example, transformer_block_example
    block = re.search(r"## Using it on your own graphs\s+```python\n(.*?)```", README.read_text(), re.S).group(1)
    assert "gm = ...  " in block
    code = block.replace("gm = ...  ", "gm = gm    ", 1)   # the one placeholder: the user's graph
    model, (x,) = transformer_block_example()
    model, x = model.to(device), x.detach().to(device).requires_grad_()
    monkeypatch.chdir(tmp_path)                           # (it writes trace.json)
    env = dict(torch=torch, gm=running_example(), model=model, x=x)
    torch._dynamo.reset()
    exec(compile(code, "README.md", "exec"), env)
    out = capsys.readouterr().out
    assert (tmp_path / "trace.json").exists()
    cx = env["switch"].explain(env["graphs"])
    assert [r["graph"] for r in cx.summary()] == ["forward 0", "backward 0"] and cx.summary()[1]["errors"] == 0
    assert "backward 0" in out


def test_the_first_screen_states_the_model_and_the_seed():
    "The README's first screen says what the sanitizer checks, under which assumptions, and what upstream=True is."
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    first = text[:text.find("## Two commands")]
    for said in ("What the sanitizer checks, and under which assumptions", 'inputs_ready="made"', "no race\nunder that model",
                 "`upstream=True` reproduces the seed node for node", "torch 2.13", "not later\nPyTorch"):
        assert said.replace("\n", " ") in first.replace("\n", " "), said
    assert "proves a graph" not in first
