"""The torchrun command recd builds, on one machine and on several."""

from __future__ import annotations

import pytest

from recd.errors import ConfigError
from recd.train.launch import Nodes, torchrun_command


def test_one_machine_is_standalone() -> None:
    command = torchrun_command(2, ["train", "--config", "c.toml"])
    assert "--standalone" in command and "--nnodes" not in command
    assert command[command.index("--nproc_per_node") + 1] == "2"
    assert command[-3:] == ["train", "--config", "c.toml"]


def test_several_machines_use_a_static_rendezvous_at_node_zero() -> None:
    nodes = Nodes(nnodes=3, node_rank=2, rdzv_endpoint="head.example:29400")
    command = torchrun_command(4, ["train"], nodes=nodes)
    assert "--standalone" not in command
    flags = dict(zip(command[3:11:2], command[4:12:2], strict=True))
    assert flags == {
        "--nnodes": "3",
        "--node-rank": "2",
        "--rdzv-backend": "static",
        "--rdzv-endpoint": "head.example:29400",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nnodes": 0}, "--nnodes: expected an integer >= 1, got 0"),
        ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, r"--node-rank: .* \[0, 2\)"),
        ({"nnodes": 2}, "--rdzv-endpoint: expected HOST:PORT"),
        ({"nnodes": 2, "rdzv_endpoint": "host"}, "--rdzv-endpoint: expected HOST:PORT"),
        ({"nnodes": 2, "rdzv_endpoint": "host:99999"}, "--rdzv-endpoint: expected HOST:PORT"),
    ],
)
def test_bad_node_settings_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Nodes(**kwargs)  # type: ignore[arg-type]


def test_restarts_need_one_machine() -> None:
    nodes = Nodes(nnodes=2, rdzv_endpoint="h:1234")
    with pytest.raises(ConfigError, match="--max-restarts with --nnodes > 1"):
        torchrun_command(1, ["train"], max_restarts=1, nodes=nodes)
