"""The ISR layer (Kafka's per-partition replication): the sans-IO core and the
controller's pure decisions for it (AlterPartition, leader election)."""

from mqlog.replication.isr.core import AlterPartition, IsrCore, PartitionState

__all__ = ["AlterPartition", "IsrCore", "PartitionState"]
