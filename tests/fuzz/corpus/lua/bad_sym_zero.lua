local cfg = config{batch = 0}
sym{B = cfg.batch}
