-- require: no modules
local x = input("x", {4, 8})
local lfs = require("lfs") -- ERROR
minimize(x:sum())
