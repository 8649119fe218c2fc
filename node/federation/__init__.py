"""Federation: what goes to which peer (outbound.py), how peers' changes are applied (inbound/), catch-up
(sync.py), the outbox sender (sender.py), who sees what (policy.py), signature checks (verify.py) and the
reject codes (codes.py). ``Federation`` (facade.py) composes them for one node; ``node.assemble`` builds it.

Nothing is re-exported here: importing one part (the reject codes, say, as the MCP capabilities do) must not
import the whole room.
"""
