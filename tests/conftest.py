import os
import shutil

import pytest

# absolute, so subprocesses started in another folder (cwd="/", tests/) share it instead of making their own
os.environ["FMHA_DSL_CACHE_DIR"] = os.path.abspath(
    os.environ.get("FMHA_DSL_CACHE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache"))

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHARED = os.environ.get("FMHA_SHARED", os.path.join(os.path.dirname(REPO), "shared"))


def pytest_collection_modifyitems(config, items):
    """`gpu` tests run only where a GPU is visible (torch.cuda or nvidia-smi)."""
    has_gpu = False
    if shutil.which("nvidia-smi") or shutil.which("rocminfo"):
        try:
            import torch  # noqa: F401

            has_gpu = torch.cuda.is_available()
        except Exception:
            has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def interp_worker():
    """A worker process running Triton's CPU interpreter, one per harness test module (tests/interpreted.py)."""
    from interpreted import interpreter_worker

    with interpreter_worker() as ex:
        yield ex


@pytest.fixture
def write(tmp_path):
    def _write(name, text):
        p = tmp_path / name
        p.write_text(text)
        return str(p)

    return _write
