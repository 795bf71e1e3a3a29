"""The MDLM engine: coordinates, hooks, token encoding, the sampler and the likelihood, floors."""
