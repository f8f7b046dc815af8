"""memq.broker: the broker core (processors, groups, admission, the doors' seam), its front doors
(`doors/`) and the `Broker` that assembles them (`server`). Run one with
`python -m memq.broker --config FILE`.

Import what you use from its modules (e.g. `from memq.broker.server import Broker`): this
package imports nothing, so a door importing the core never loads the assembly.
"""
