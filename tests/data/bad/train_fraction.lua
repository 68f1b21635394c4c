-- an integer setting given a fraction
local x = input("x", {4, 8})
train{steps = 2.5} -- ERROR
minimize(x:sum())
