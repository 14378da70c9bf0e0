"""The cuda backend: sessions executed on a real NVIDIA GPU through cuda-python."""
