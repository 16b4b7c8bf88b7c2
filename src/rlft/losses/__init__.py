"""Pure loss functions over tensors: no models, files or devices."""
