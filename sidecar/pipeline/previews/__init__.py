"""Previews: a thumbnail and a sprite sheet planned with the request (`planning`) and made
from each piece of frames as the encode lets go of it (`making`)."""
