"""`isolation`: each sandbox test once under bubblewrap (skipped, saying
so, where bwrap is missing or cannot make namespaces) and once under the
fallback."""

from __future__ import annotations

import pytest

from kvq_jax.tasks import sandbox_isolation


@pytest.fixture(params=[sandbox_isolation.BWRAP, sandbox_isolation.FALLBACK],
                scope="module")
def isolation(request):
  if request.param == sandbox_isolation.BWRAP:
    found = sandbox_isolation.probe_bwrap()
    if found is None:
      pytest.skip("bwrap is missing or cannot make namespaces here")
    return found
  return sandbox_isolation.probe_fallback()
