"""One recipe per training method: batch -> tensors -> a pure loss from `rlft.losses`."""
