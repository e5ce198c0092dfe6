"""Running an encode: an accepted request run to its result (`encodes`), one encode run to
completion (`jobs`) on the route chosen for it (`routes`: a fresh encoder, a ready one
from `warm`, segments, or an encoder process), frames handed to the encoder in order
(`feed`, `consume`), encode slots and threads (`scheduler`)."""
