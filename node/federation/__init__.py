"""Federation: what goes to which peer (outbound.py), how peers' changes are applied (inbound/), catch-up
(sync.py), the outbox sender (sender.py), who sees what (policy.py), signature checks (verify.py) and the
reject codes (codes.py). ``Federation`` (facade.py) composes them for one node; ``node.assemble`` builds it.
"""

from node.federation.codes import RejectCode
from node.federation.facade import Federation, peer_rate_of
from node.federation.inbound.common import Applied
from node.federation.outbound import Delivery, NoDelivery
from node.federation.sync import SyncOutcome

__all__ = ["Applied", "Delivery", "Federation", "NoDelivery", "RejectCode", "SyncOutcome", "peer_rate_of"]
