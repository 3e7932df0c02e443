//! Kaplan–Meier censoring weights for Fine–Gray (being written).
