"""The testbed's mesh: an N-node layout on disk (build), run as local processes (local, control), in network
namespaces (netns) or containers (docker), and the state file that says which pids are ours (state).

The names other rooms and the tests use, handed on:
"""

from testbed.mesh.build import MeshLayout as MeshLayout
from testbed.mesh.build import NodeSpec as NodeSpec
from testbed.mesh.build import agent_id_for as agent_id_for
from testbed.mesh.build import build_layout as build_layout
from testbed.mesh.local import LocalMesh as LocalMesh
from testbed.mesh.local import health as health
