from dataclasses import dataclass

import numpy as np
import torch

from raysim.contract import Cost
from raysim.system import Ledger, SystemConfig, SystemModel, payload_bytes


def test_ledger_accumulates(run_round):
    model = SystemModel(SystemConfig.model_validate({"comm": {"phi": 2.0}, "compute": {"unit": "batch"}}), 0, 3)
    ledger = Ledger()
    costs = [Cost(oracle_calls=64, oracle_batches=2, upload_vectors=1.0, upload_bytes=400)] * 3
    server = Cost(oracle_calls=10, oracle_batches=1)
    first = run_round(model, 0, costs, server)
    row = ledger.add(first, costs, server, download_bytes=3 * 500)
    assert row == {"gamma": 3 + 2.0 * 3, "sim_time": first.round_time, "oracle_calls": 3 * 64 + 10, "upload_bytes": 1200,
                   "download_bytes": 1500}
    second = run_round(model, 1, costs, server)
    row = ledger.add(second, costs, server, download_bytes=3 * 500)
    assert row["gamma"] == 18 and row["oracle_calls"] == 2 * 202 and row["upload_bytes"] == 2400
    assert row["download_bytes"] == 3000
    assert row["sim_time"] == first.round_time + second.round_time


def test_ledger_counts_bytes_of_kept_clients_only():
    model = SystemModel(SystemConfig(), 0, 3)
    costs = [Cost(oracle_calls=5, upload_vectors=1.0, upload_bytes=100)] * 3
    clients = np.arange(3)
    dropped = np.array([False, True, False])
    timing = model.close_round(0, clients, np.array([8.0, 20.0, 9.0]), costs, Cost(), 0.0, dropped)
    row = Ledger().add(timing, costs, Cost())
    assert row["upload_bytes"] == 200 and row["oracle_calls"] == 15


def test_payload_bytes_counts_the_numbers_a_broadcast_carries():
    @dataclass
    class Bcast:
        params: np.ndarray
        lr: float

    assert payload_bytes(Bcast(np.zeros(100, dtype=np.float32), 0.1)) == 400 + 8
    assert payload_bytes({"a": torch.zeros(3, 5, dtype=torch.float64), "b": [np.zeros(7, dtype=np.int16), None]}) == 120 + 14
    assert payload_bytes(None) == 0 and payload_bytes((1, 2.0, np.float32(3))) == 24
