"""The guest graph model: topological replay order, cycles, instantiation snapshots, copy
pieces (no library, no daemon)."""

from __future__ import annotations

import pytest

from crane.api.results import CudaError
from crane.interposer import graphs as G


def test_order_respects_added_edges_and_rejects_cycles() -> None:
    g = G.new_graph()
    a = g.add(G.EMPTY, None)
    b = g.add(G.EMPTY, None)
    c = g.add(G.EMPTY, None, [a])
    a.deps.append(b)  # an edge added later: b must now come before a
    assert g.order() == [b, a, c]
    b.deps.append(c)
    with pytest.raises(CudaError):
        g.order()
    G.destroy_graph(g)
    assert a.handle not in G.NODES


def test_exec_is_a_snapshot_with_dependency_indices() -> None:
    g = G.new_graph()
    a = g.add(G.MEMSET, G.MemsetParams(0x10, 0, 1, 4, 8, 1))
    b = g.add(G.EMPTY, None, [a, a])  # duplicates collapse
    x = G.GraphExec.of(g)
    assert [n.deps for n in x.nodes] == [[], [0]]
    g.remove(a)
    assert b.deps == [] and len(x.nodes) == 2 and x.find(a.handle).kind == G.MEMSET
    with pytest.raises(CudaError):
        g.add(G.EMPTY, None, [G.new_graph().add(G.EMPTY, None)])


def test_copy_rows() -> None:
    assert list(G.CopyParams(100, 200, 16).rows()) == [(100, 200, 16)]
    assert list(G.CopyParams(100, 200, 8, 2, 1, 8, 8).rows()) == [(100, 200, 16)]
    assert list(G.CopyParams(100, 200, 4, 2, 2, 16, 8, 3, 2).rows()) == [
        (100, 200, 4),
        (116, 208, 4),
        (148, 216, 4),
        (164, 224, 4),
    ]
