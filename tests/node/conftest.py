from pathlib import Path

import pytest

from mesh import keys
from node.assemble import open_service
from node.config import NodeConfig, from_dict

AGENT = "ai:test-node@lab"


def make_config(home: Path, **sections) -> NodeConfig:
    return from_dict({"agent_id": AGENT, "home": str(home), **sections}, env={})


@pytest.fixture
def cfg(tmp_path: Path) -> NodeConfig:
    c = make_config(tmp_path / "home")
    keys.generate_identity(c.keys_dir, AGENT)
    return c


@pytest.fixture
async def svc(cfg: NodeConfig):
    s = await open_service(cfg, require_identity=True)
    yield s
    await s.close()
