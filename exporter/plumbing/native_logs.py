"""Keep ExecuTorch's native logging off the terminal unless something fails."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import ExporterError


@contextmanager
def native_logs_captured() -> Iterator[None]:
    """ExecuTorch's C++ runtime logs every kernel call to fd 2 ("No temp allocator provided", ...).
    Park fd 1 and 2 in a temporary file while it runs; replay it only if the block fails with
    something other than our own one-line errors (which already say what is wrong)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        except ExporterError:
            raise
        except BaseException:
            os.dup2(saved[1], 2)
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace")[-4000:])
            raise
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
