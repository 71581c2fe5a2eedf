"""Hardware, cluster and model catalogues, and the cluster schema the cost model reads."""

from gplan.profiles.schema import ClusterSpec, DeviceSpec, Efficiency, LinkSpec, NodeGroup

__all__ = ["ClusterSpec", "DeviceSpec", "Efficiency", "LinkSpec", "NodeGroup"]
