-- an integer setting past its range does not wrap around
local x = input("x", {4, 8})
train{steps = 2, grad_accum = 4294967297} -- ERROR
minimize(x:sum())
