"""The torch building blocks both sides of a rank share: the device, the Hugging Face model built from its
config, and the byte counts of tensors. Below engines and runtime, so neither imports the other for them."""
