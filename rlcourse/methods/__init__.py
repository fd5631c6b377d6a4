"""The chapters' methods. Importing this package registers every method's parts (advantage
estimators, rewards, samplers, losses, tasks) in the loop's registries. Nobody needs to import it by
hand: a registry imports it the first time it meets a name it does not know
(:func:`rlcourse.registry.load_methods`), so the trainer never imports the chapters and the chapters
import only the registries (no cycle)."""
from .. import lagged  # noqa: F401  (registers the loop-level "lagged" sampler)

from . import apriel, banel, compute_aligned, cot_influence, cuts, data_scarcity, drest_lm, epm_rl, evpo, freshper, gipo, heapa, noisy, otb, pgrpo, pipo, poly_epo, r2po, repexp, retaining, sgrpo, sharpening, sorl, soup, sps, tcrm  # noqa: F401,E402
