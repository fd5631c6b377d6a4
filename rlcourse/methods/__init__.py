"""The chapters' methods. Importing this package registers every method's parts (advantage
estimators, rewards, samplers, losses) in the loop's registries, so the trainer can name them."""

from . import drest_lm, evpo, gipo, noisy, otb, pgrpo, sgrpo  # noqa: F401,E402
