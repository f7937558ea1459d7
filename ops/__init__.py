"""ops"""

from eventstore.spi import require_ledgerflow_packages

require_ledgerflow_packages("eventstore")

__ledgerflow_package__ = True
