"""The model families, one module each (torch-free); ``base`` says what a family is. The catalogue finds them."""
