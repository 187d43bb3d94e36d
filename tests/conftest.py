import dataclasses
import os
import sys
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    """The suite in several processes (README: `pytest -n auto --dist loadfile`, pytest-xdist; each test file in one
    worker, so its module fixtures are built once): each worker's torch gets its share of the cores, not all of them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(autouse=True)
def no_run_plots(request, monkeypatch):
    """A finished run draws its plots/ (six PNGs, about a second of CPU: a sixth of a short test run). Here only
    tests marked `run_plots` draw them, those that read them; test_plots.py draws every figure. (The notebook tests'
    kernels and tests/distributed_run.py skip them the same way; other subprocesses draw them.)"""
    if request.node.get_closest_marker("run_plots") is None:
        import minigrpo.lab.plots

        monkeypatch.setattr(minigrpo.lab.plots, "plot_runs", lambda *args, **kwargs: [])


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A very small random Llama + the project's tokenizer, saved with save_pretrained like any local model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from minigrpo.loading.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("random_model")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture
def one_thread():
    """One torch thread here, and the environment for a subprocess that runs the same way.

    Runs compared for equality must use the same number of threads (a reduction split over two threads may
    round differently), and one thread is several times faster for a model this small on a shared CPU.
    """
    import os

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory):
    """A Qwen2-architecture chat model with random weights and a ChatML template, built offline (lab/standin.py)."""
    from minigrpo.lab.standin import make_standin_chat_model

    return make_standin_chat_model(tmp_path_factory.mktemp("standin"))


@pytest.fixture(scope="module")
def single_torch_thread():
    """One intra-op torch thread for a module (`pytestmark = pytest.mark.usefixtures("single_torch_thread")`):
    thousands of tiny ops run faster, and steadier on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory):
    """A reward model as TRL users give one: the shipped think_addition model's body under a scalar head
    (LlamaForSequenceClassification, num_labels=1, the head drawn with a seed), saved with its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from minigrpo.tasks import get_task

    source = get_task("think_addition").model_dir
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
    path = tmp_path_factory.mktemp("reward_model") / "rm"
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path


@pytest.fixture
def config_reads():
    """(recording, read): recording(cfg) is cfg as a Config that adds to the set `read` the name of each field that
    code reads from it, its own checks and dataclasses' copying aside: the keys a command's CONFIG_KEYS must hold."""
    from minigrpo.config import Config

    fields, read = {f.name for f in dataclasses.fields(Config)}, set()
    own = ("__post_init__", "validate", "to_dict", "_normalise_values")  # and _validate_*: Config checking itself

    def config_itself(frame) -> bool:
        while frame is not None:
            file, name = Path(frame.f_code.co_filename).name, frame.f_code.co_name
            if file == "dataclasses.py" or (file == "config.py" and (name in own or name.startswith("_validate"))):
                return True
            frame = frame.f_back
        return False

    class Recording(Config):
        def __getattribute__(self, name):
            if name in fields and not config_itself(sys._getframe(1)):
                read.add(name)
            return object.__getattribute__(self, name)

    def recording(cfg):
        return Recording(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config)})

    return recording, read
