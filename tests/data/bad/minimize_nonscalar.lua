-- minimize() of a tensor that is not a scalar
local x = input("x", {4, 8})
local y = exp(x)
minimize(y) -- ERROR
