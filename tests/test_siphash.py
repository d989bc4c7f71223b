"""SipHash-2-4 against the reference test vectors (the paper's appendix, vectors.h)."""
from rlbcommon.siphash import siphash24

KEY = bytes(range(16))


def test_reference_vectors():
    assert siphash24(KEY, bytes(range(15))) == 0xA129CA6149BE45E5        # the paper's example
    assert siphash24(KEY, b"") == 0x726FDB47DD0E0E31                      # vectors.h, length 0
    assert siphash24(KEY, bytes(range(8))) == 0x93F5F5799A932462          # length 8


def test_the_key_and_every_bit_matter():
    m = bytes(48)
    a = siphash24(KEY, m)
    assert siphash24(bytes(16), m) != a and siphash24(KEY, b"\1" + m[1:]) != a
