"""RocketMQ-style master-slave replication of one store per broker."""

from mqlog.replication.master_slave.core import MasterSlaveCore

__all__ = ["MasterSlaveCore"]
