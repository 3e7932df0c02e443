//! Shared risk-set machinery for Cox and Fine–Gray (being written).
