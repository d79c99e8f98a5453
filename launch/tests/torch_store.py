"""PyTorch's own TCPStore against unihal's (launch/tests/all/torch_store.rs).

client PORT: torch's client against unihal's server: every request torch's workers make.
serve PORT: torch's server (the one torchrun's agent runs) for unihal's client; waits for the
            keys unihal's client sets and checks them, through PrefixStore as torchrun's workers.
"""
import datetime
import sys
import warnings

warnings.filterwarnings("ignore")
import torch  # noqa: E402
from torch.distributed import PrefixStore, TCPStore  # noqa: E402

mode, port = sys.argv[1], int(sys.argv[2])
T = datetime.timedelta(seconds=20)
print("torch", torch.__version__, flush=True)
if mode == "client":
    s = TCPStore("127.0.0.1", port, is_master=False, timeout=T, use_libuv=True)
    s.set("from-torch", "hello")
    assert s.get("from-unihal") == b"rust", s.get("from-unihal")
    assert s.add("ctr", 3) == 3 and s.add("ctr", 4) == 7
    assert s.check(["from-torch", "ctr"]) and not s.check(["absent"])
    assert s.compare_set("cas", "", "first") == b"first"
    assert s.compare_set("cas", "wrong", "second") == b"first"
    assert s.compare_set("cas", "first", "second") == b"second"
    s.append("log", "a")
    s.append("log", "b")
    assert s.get("log") == b"ab"
    s.multi_set(["m1", "m2"], ["x", "y"])
    assert s.multi_get(["m1", "m2"]) == [b"x", b"y"]
    assert s.delete_key("m1") and not s.delete_key("m1")
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        raise SystemExit("a wait for a missing key returned")
    except Exception as e:  # torch's DistStoreError: the cancelled wait
        assert "timeout" in str(e).lower() or "Timeout" in type(e).__name__, e
    # The connection is still in step after the cancelled wait.
    PrefixStore("/worker/attempt_2", s).set("pk", "p")
    assert s.get("from-torch") == b"hello"
    print("num_keys", s.num_keys(), flush=True)
    s.set("torch-done", "1")
    print("torch client: every request answered", flush=True)
elif mode == "serve":
    s = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=T)
    print("serving", flush=True)
    w = PrefixStore("/worker/attempt_0", s)
    w.wait(["from-unihal"])
    assert w.get("from-unihal") == b"rust", w.get("from-unihal")
    assert w.add("ctr", 0) == 5, "unihal's adds"
    w.set("from-torch", "hello")
    w.wait(["unihal-done"])
    print("torch server: unihal's keys read through PrefixStore", flush=True)
