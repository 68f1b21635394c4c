-- a function kiln does not have: the message names it and the nearest ones
local x = input("x", {4, 8}, "f32")
local y = cosh(x)
minimize(y:sum())
