"""Built-in acceptance methods."""

from speculant.acceptance.rejection import RejectionSampler
from speculant.acceptance.typical import TypicalAcceptance, TypicalOptions

__all__ = ["RejectionSampler", "TypicalAcceptance", "TypicalOptions"]
