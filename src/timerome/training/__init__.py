"""MDLM training: the embedded default model, fresh models, the Forget Quality reference."""
