"""What tests share: typed fakes of memq's Protocols and helpers, imported as `tests.support.<module>`
(test modules import from here, never from each other)."""
