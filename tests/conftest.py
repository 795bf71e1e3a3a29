import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models: thread start-up costs more than it saves, and CI has 2 cores
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
