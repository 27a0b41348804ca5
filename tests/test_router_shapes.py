"""A cluster member's node.toml (one with a [controller] table) and no [groups] hosts no
group of its own: only the controller's group and what the metadata assigns (it used to
get a stray ``default`` master-slave group whose store was data_dir itself, which took
every request naming no group). Keys that would describe such a group are refused, said;
a config without [controller] is the single-group node of before, unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from mqlog.config import DEFAULT_GROUP, BrokerConfig
from mqlog.errors import ConfigError

CLUSTER = """[node]
id = "b1"
listen = "127.0.0.1:7001"
data_dir = "data/b1"
process_roles = "{roles}"
{extra}
[node.peers]
b2 = "127.0.0.1:7002"
b3 = "127.0.0.1:7003"

[controller]
voters = {{b1 = "127.0.0.1:7001", b2 = "127.0.0.1:7002", b3 = "127.0.0.1:7003"}}
"""


@pytest.mark.parametrize("roles", ["broker", "controller", "broker,controller"])
def test_a_cluster_member_hosts_no_default_group(tmp_path: Path, roles: str) -> None:
    path = tmp_path / "b1.toml"
    path.write_text(CLUSTER.format(roles=roles, extra=""))
    config = BrokerConfig.load(path)
    assert config.groups == () and config.default_group == ""


@pytest.mark.parametrize("extra", ['layer = "raft"', 'voters = ["b1"]', "partitions = [[\"t\", 0]]",
                                   'role = "SYNC_MASTER"', "slave_read_enable = true"])
def test_group_keys_in_a_cluster_member_are_refused(tmp_path: Path, extra: str) -> None:
    path = tmp_path / "b1.toml"
    path.write_text(CLUSTER.format(roles="broker,controller", extra=extra))
    key = extra.split(" ")[0]
    with pytest.raises(ConfigError, match=f"{key} describe the single group.*cluster member"):
        BrokerConfig.load(path)


def test_a_config_without_controller_keeps_its_default_group(tmp_path: Path) -> None:
    path = tmp_path / "n.toml"
    path.write_text('[node]\nid = "m"\nlisten = "127.0.0.1:7001"\ndata_dir = "data/m"\n'
                    'role = "SYNC_MASTER"\nslaves = ["s1"]\n[node.peers]\n'
                    's1 = "127.0.0.1:7002"\n')
    config = BrokerConfig.load(path)
    (spec,) = config.groups
    assert spec.name == config.default_group == DEFAULT_GROUP
    assert config.group_dir(spec) == Path("data/m")
