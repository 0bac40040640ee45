"""A separate client process that owns one buffer: prints its handle, exits when stdin closes.

Used to test what readers see when an owner process is gone or stopped,
without killing a proc of the test's own mesh (which supervision would report).
"""

import base64
import pickle
import sys

from monarch.rdma import RDMABuffer

data = bytearray(b"owned elsewhere " * 4096)
buf = RDMABuffer(data)
print(base64.b64encode(pickle.dumps(buf)).decode(), flush=True)
sys.stdin.read()
