mod golden_sccs;
