"""One module per public name: each turns its API's arguments into a swap."""
