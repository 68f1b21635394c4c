-- a method tensors do not have
local x = input("x", {4, 8})

local y = x:frobnicate() -- ERROR
minimize(y:sum())
