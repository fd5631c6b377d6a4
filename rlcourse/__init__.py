"""rlcourse: the companion package of the book on RL post-training of language models."""
from .profiles import Profile, cache_dir, profile, seed_everything, torch_threads

__version__ = "0.1.0"
__all__ = ["Profile", "profile", "seed_everything", "cache_dir", "torch_threads", "__version__"]
