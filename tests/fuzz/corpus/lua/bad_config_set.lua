-- a correct script, loaded with bad --set values by the test
local cfg = config{width = 8, name = "tiny", flag = true}
local x = input("x", {4, cfg.width})
minimize(x:sum())
