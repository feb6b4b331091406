#!/bin/bash
# Reaper user-data for Pod batch/installer-7xk2p (uid 6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b).
# Rendered by github.com/reaper-k8s/reaper/pkg/userdata; change the Pod, not this.
#
# Installs the workload supervisor (/usr/local/bin/reaper-wrapper, run by reaper-workload.service),
# points the CloudWatch agent at the exit log, and starts both. If a step
# fails, the host powers itself off in 10 min: no instance is left idling.
# REAPER_ROOT (unset on a real host) installs under another root, for tests.
set -Eeuo pipefail
root=${REAPER_ROOT:-}

fail() {
	echo "reaper user-data: failed at line $1; powering off in 10 min" >&2
	shutdown -P +10 "reaper: user-data failed" || true
	exit 1
}
trap 'fail $LINENO' ERR

umask 022
mkdir -p "$root/usr/local/bin" "$root/etc/reaper" "$root/etc/systemd/system" \
	"$root/opt/aws/amazon-cloudwatch-agent/etc" "$root/var/lib/reaper" "$root/var/log/reaper/"

# The wrapper, gzip-compressed to leave room for the Pod in EC2's 16 KiB;
# "reaper userdata -o wrapper" prints it.
base64 -d <<'REAPER_EOF' | gzip -dc >"$root/usr/local/bin/reaper-wrapper"
H4sIAAAAAAAC/7R7e1fbSPLo//oUlR4RW4CwbB5J7Ch72cTJcCeBXDC7s4NZH0VqmQ6y5JVkTAK+
n/13qrpbL5vszPx2z+EYqbuqurq6ul7d+ulZ54uIO9mN8ROk3Jvz1F6m3nzO010I02QGU5HfLL7s
+cmso/pvX2bqEea3084i42ng5V4n57N55OU86ygKe9kNtP1kNuNxnoEXByDigMe5l4skhpTPkjse
WHuGkeVezl3z4Xx4/Hl4PrkYHY+Gk3cn5327c+elnUh8UQOuDDELshLy5NO7i8nl+ce+fZPn836n
0z16tdc7PNhT/1eGEMEkFFGF+snpxej49O1wcvJu8v7k47AyiB8li6BDkxFxlnuxz20RrIzM96oU
RiefhpOLt8eI210Z6SLOxYxP8CdZ5CXc+eUpgeLP2eWobx85zsqYL6Jo4uUorbwylc+XHz9Ojkej
4afPo4u+fbgysptFHiTLeOLPgopwfr4cvTv7++nk7ad3fVvDgP0Z4mS5Mrwpj/NJINIS4/jD8HRU
E2oyzzveMut4M+97Ets07aWX+zc2oXeiZJp1aFGQCzGf8DhwDT+JQ9d86PbtgvTbs9P3Jx/6dofn
vlqizjJJb6PEC/YQfrUyvvM0cR3H6dr0N3KcPv39ZoSz3G09POxd4Ej0u8hWq8eiZXgv8rdJwKtt
Z2effhFRxINq40XupTkPjvNq43sRi+ymbD2poQzTNElXq5Zh6Kl8PHGDxL/lKTQl/W748fgf7pHj
6J5Px79OzocXo+Pz0YXrrMF/Ons3dJc3PLZReHMeaIjPZ+8mfz8/GY2Gp5PR8Qe31dKjD389GU0+
nn1wpS4mUy1Nfi/yvSiZahJq2Mnns48nb//htlpV2v/34uy00kRER2e/DE8rI709Ox0dn5wOzyuc
fzg/fjt098v5XXzAOboHzqsj3fa3s4+Xn4YX1RGPLy+Gk5NPxx+Ga63nl6eT4/MPCG4YUTJtW/AA
81TEeQitup3pw1Y2jlvAzG0Gb573BrAyDBHnhOJ7GQezCyKGVgseYfvqmWO/ut62IOX5Io2hC4MB
8MzzCS325oSWRZzPgZltb3kL9h1kLjO7DJ9uXWbSdmbQ+uvww8lpyRfbmo5jtgsZdOAWVi2LSZrJ
kmgGXs7BXsDO1j/srZm9FYy2fu5vfepvXfxGcJn4zhHQyL67Znvpg+1D700n4HedeBFF8JpYeIQ8
BTvwwbFfWQb3bxJg5kP2vW87K2asDLWBkzDMOInAOHl/4aJpDsBOwUuaNCU8bVYGz5+DiHNgppfQ
i6LvJUT6a5bEkyxPiaxeDLaVMRR+WzdsZfiqWW2N83E8TlvQAoCWZh9aY8dx7LGz/wLbMh5AK+uM
x53xeDzuTAeQdVhnPGadacsqh849EdHYSQD2cYzLYeeLLjyCWqaZdy8XqmU8QJik0A7Bhe4AQnjt
wun7AYQ7OxZ8uYp3dq7BBTOEHXBgZQxP38GDIcAFx1jeiIhDW8BriEkg8Br28eHLlbiGNy50ey+L
19fQfdWzQOzsGLM1bGTVB5cgBxDxmCBECG0fEXsvSUPn4IKvu7uwMniUcZBQONqrAxwNMXq9gxID
bBxa4/XW8Hq9Eu/AqeH1egcab38d78Ap8Q7reAeOxjuAlZHcgkuvb8CRgtqh19cuxAZJ/1ZKP7nF
7lt4jd0DuMU1eDACKRnYgdtrEkoghQKPjxDImfcsoEEcyaNkZA7bcHQAOxCgCHovjRVhy0GIO1eu
V9uf4yScAyKJb29cODzsvTqiCWLn4Yv9gwPLKoZZI3RQEjo6PNw/QkpICLrd7kG3262jPktuC4Eh
+H6xrANYXs2upcCBJqPeIx4bi6uZ1Ed/PkApytaVkSPhAWTgwkwrVqalncMOLK8ylME1inzm3ZPl
su0B9rnYeY2rtEAyjJUrkg1oLWbFShC/iyu1DPjmwv6BBRIVf9l4PGasoikEQ+tTgxnXYd64sN8r
hN3tvajCZ9JgtNmWz3bBn1s1VCXvjQjj8WLLObivYpHQbSn1o8EPkEpcqQk7aPBwwA50nd6BtQuH
R/s9B3aQ4JZsg5Wx0vaOjdlWNmZsF6kbqxYaJx5584wHZJqUJfIKh/HFZWYPLVK4iH0KXPN2tgsA
4S5824UZIuGcM3j2/6Hzzyt0T40fe+PjqHzsb3zsFE7O7hrZPBI0cLgLnSt71P9t77pjGd/AhfCq
e412cAAzeuvRGzE1Q83qoV59Q72aoV510dYowu39o0PYhm9KjN+gAwcW2MVL13Gsal/52u4e7sM2
jmDDPjb2LOjAIT6FV/vXFmzDy6MDx6H3g2vYhv0j9XaIb0fy+ejaWBnaD9+DC3nbswbwnZ6+WAPp
m6F9D6/Bwc37HV7DvQV/AQf6xMh3sLFBrmQmprE3k264DB2MriU94cXJh58vP2PE0CtbTk5H2LJf
tvy/yxNqOqgAffwIg4FxVLYc//WcgF6UTX+9vMCWl2XL+89DbHlVtvyiKHWdsu3y4pzCmG6Fz4vh
h79RW68G16O2Cq+fT2gIo1th9vjj+SeCOyzbRkNqMzBUQknNeO5hokOiypNb12z7izQCO8wuwJ5B
D+xf4fPlCOyfofWr7S0zm/s9W6PZeXLLYzvPIzvjfhIHWR+OHAwcMEHrUBqYd7y56BAgs+D5c6M5
wM/AnqLcBzNPblmDHsLYlJ6ZXWasqqEQhowyY5uIoLL+D0IEfXuFAaSwy7DR0WEjJogu7hURuGZb
MwGV9M8aQH7DY0VPBAUpxMR3TSkUxhXYMfIsAgbXqK4E08b4yI6h1c06/xy3BRkBzw6vt8eW2Rl3
O/OWRKJMlVWnZdVJ4srpdHMhQ11mlgkMAxGHCVQCxN6b512KTpeeyCcKlcQTu46BrxGUBAcQJEbs
mu12DDvQtXB0ZsYM7CkHZjYSXZzi8+dFIF7A8n9BV3Zh3sL8JM49EfNUDwRxkoMXZ0ueing6AGRN
xFNYzCFPwHxoDLPKGMb10DWCJOYGJQfZnPsyOqaEu10XQjmiggTbDpN05mFkHM5yJuPbqphxrYqJ
YMTdemwVQXcm4+tFhk9+EnD8nyQz1YGpJz6GKuHEZ0G/HJNMeP16ePbeMNHf4IPUI01JoHWHRyCL
r/+vv9CPhaq2bWkuXLtIfkj2kimGpjNdcKl/ss0NvSjjRsmu2wz3yy5WxvP/HLdxXBv1FORzf49e
dhzHceBy9BbVdzTu/dZpWUZFBJvo674/P0AhOS10EQMVFrbhEVotC6oT/M7TpBBPgVms0QbUCvNx
srQKZG0yKFSIs0XKJ2LmTeU2amw/bC+0jrSssRkrO8YxYrcLgdvVG7FOa44okgQmxUFS34y1MlJz
K9LGIwJJiD4w9ETEA2greDBjawAxv89RDuZDoPcYMwNWMwCA0mgHsA09ZQ0CZCCHfceRYwbuvuMU
W9O/8yi9BH7nRcCqSjBm47JuZHYnZq9vr8ZMJtl+IGRaKkK4qgiiKFYUdkVaY53Zyrx3IEPyalvH
75ht5EaK8PT40xDz+VAgl1HiKR8hXLMLPsYM7ho4+LciDmrtv5ycvrPAp2WudVAVxDL8WTattX+6
+GCBny7iWquujljgZ9gRCNlhSeb8WxKhVIrZreyVs8LOmuVCxQBcOmfPOcSXmKNAF3FBJp2tESCR
/wTZDY8i/4b7txCIzPsScffiba/bc+AnEHkGXjpdyNqtn8y4LAfnN7y0r60MbTrCZQZtPBKqzHT6
pLLV/QLMlJJjaJlIRWW7agaRSddw54kIuRlAnn5Dz5Ancpz429L7xgypWxlHuw4mSpeh3vjka+ub
CNHsAGwblxi3jzfjaP7/DwqRmX7WSRfxHk9TVrh5UbdesjTli8JuoSM35y2rtAuhMOS6T1M+hz2o
0YVHyD0RIRraeX+Rg+13bQylKewobAWxVmWC3EjN6KELEjFOKkaxPMLcWyBL6LtI/iKebghxeJq6
5oP2R33bnGXTlXEvnUjhie7JUygvAvelJa0Y3PuKkaxYTKMwPKHAST2rxRQ0o2r8UXG2PQOVScQL
jqjIaHX9aPmk7eoDcs1okVstzbzdVWyTg6syTeb/vmnTS0a1wfKQsTW1FSEs13QJIbUqVGMHNcM+
ZbJGmrrkfpeutMKElcSo5IGaywBo05FmV7eTlpqOd56UmZRyqTrIUi1KraqL8WN1UWMVy6BzhP+k
eqgYVmug8laklrqttptEuK5Asq65JNuxdO1uweDyD6oAKVkpc1qXO0+FBV94mKScrB/ZS/CTRYTN
FAyyGpdqpZ9eJq1jagFqZdeaYZGWCB+NvnpZzBmKjUtjkuXJXEmtrpPYAXZetlIpnxWE68FHLZSZ
8SzTUYxaIJ+22HVlEo4RushAztOZiOngzka1nnn3rlk/LZCu+xnYGUbZiturgqoL770o+uL5t6Pk
YzLNzmI6ginB5HoysGMOjm6WbFHuo/RA8hMlUxvNaiP+ipJpBjb1wEunIt6Qyejr8RH68p2CmZl3
L8MZqjLSmDgzfFPpXHUy0o77Go86HqEobat2lG2S3/A0qwY0XZSAVNHr2lalIAO3qYhFbj0lCWJa
enAeByKeMkzmZ56ILeOr24XIy3K3q2wY0vjKwI745kjquogmv8pBUE6VBdORylcV8CDrOJSGeCb1
UsctX5nVQVVXFIgV4yvGjV9VFkkbQS0mdrOnJlVYn1DgtP7QfAK3ypGW+6YZKv4DzbVaj6KjLmfa
DlcaZTGvx9qOZLU52cLPYM4wUx6mTLkrtQpJvQjsu46aTi0Nr+S/ayUGGUgpgiACWMS3cbKMoX3y
6d0FHbsXtQUIRFBJvy1mZGLqalkVejfNqZC/vjWjHLpHThGEI7LZVkU3MNttCSjr+pZlUbwtQyNl
bSwKb41ZknKVlMqtIncIbj/sIbMaiZi77GHM5HHhmPXHpdm2+b3Ix2x3zO7GrN/dHRcSOAnGrG+2
9VmXEpW1azbOSZkawMR/uxXSTXTKDpi1i4yQb3mbLOIcodR79iSpdV584mXMuDraxn4ptN0xS5KZ
PNuWrZjMNyhn+qC7Sbdwe0Q9LI6+1+GKNNxqEl+KKDqXU0I0FKryaqpVMpamynYmKa8UG3Dn18jJ
hT2Xvm/M+gjHilBATNkmJNKliNYaYcaswHjAdHEjDvqUJAwvZB0SWewVWBSBb8ChmKMpnEbNQkXv
1YgdhaYoK1epdgi9PXOhxVhr03hK/XFEBK1KfoVRhZ+kgUuvmv7aGX5hdwiWmQ8IvTVerXbHjGqm
zemsU7BWzJD5pI25/kPj8sFWZ3vFjMyhPf2dN0h8PPvALOMOe6tn1FQ6u3Ncp3JThFKAZqQjGWfw
5s06XWWBZb3Qi8lCzec8Dqgi2IQ2eLTBqxZLofSy0bzpkgaC1e5paFegyN850hgyM3NKP0FckghA
igDMOweT17mX5RTRI+NJuMY4tM3MgS/fcp5ZfYwvI75L1lhXQMMkBZHLM7hSnD9YDSr7Kbgaq1T7
K9YjFCqqfiIS0UEn+UPjCSE217Mct/DiRRMOJ0sQUlpo7mhH9IGUnIKkPIkCFX02VrIafxIRUijl
KQhIMU7rJuKp8UeZq89YsboyjMyTpwdAqbz9r/eStXXZ12swiKlYkVdAfsfa/WAn/X591dpdVwKn
7CAVpsCpBGloBzK/mPP0TmQyG4gSL6B5V42Fn6Gdkg4PIy0qpvtZp3CCG+rpCtpRyVsJWu9VBtzt
OlpHS8jKdGp5Ft10Ufmvuk8kPbVtttsaHQMRy9LWpcJ9AwI1opr+Uz2wQVVjUP7YakGaqoxTViQg
9HIvclstqatVXnXiQgAbjkPqMRkZgY2HIGT1/kS96N8UAGQA6QXJnGyQBq5kyLJoNhgY2xY0sucb
LwAvwtz4G+Am5wEpKFlBrVRJCsXZwn+juvDHSx6qWxZ/UBn/7dpQART1FJYiv6Gi+YYV0rMj+02q
XE2rG8a2kVIzw7+ZJQE4R0dHsBkgFLLKqmb8F5ypY0kLq4VEiwVtDDQt9t+caM/6DxGDSs5Xyoxo
l0KjWhG1lRvvz9YAQ2FQguQatfoCmhQ0/8CaEfyYQMaMEhSJ2i2ON8m1obP3RbkVUj5PSOGLDNb+
Dswk3KeGUgPh+lFi81S2scuo5r/RmlG2KE8BDAPjeZVkVUoNfXPjTVLUpUwE3PfS/rYF66Wnx0cg
ghTuDwZUruif8jueWsXr9pP1ixrqzBNx/zhaet8ya0PPWfzeE9Ei5b+Pmjr/rGlNASSnr7wKttQz
loqjrd7pXfOiVX/En8KpxYcKAyIxEzlsQoCUe/4ND6TBl1lmdc1CIa+Hrq2vsh9l9tmYXj22K7eU
1j6VvGP4pYMpeXyGnKqGUNRKnRSRtNU9qVq62cwpSUBH+nCw4tkbTKA+0YC0GMxUkKxqNqtlv8ax
zgzs8IkiZ1ETkaVbtEPyUwPaomRFn947tcVDDyIXRh6TKh5XGWgsKDTD0geoxUT03M12Wz1WTlE1
VP0sVaPsO87m4m+xJrq0/OcO8TZe1TbIVVbLwev3vJvF4SdK3071eELFUUT9yUMKHXZsOL1qFrxR
7FWaPzxh36Q2P0KmXVc/s9wkhcb55TrInzzL3LgwzPjRmWZtNnSwWZuSzn7K48hHqeMYoX1OglYG
Mc+XSXpbifi0/yZh96FysNkk9uTZJmV4qLkT5VVkNTzgXkC1D7PdNtt0pX5nK7Ngp/YpAkbkSQpz
2nYaXx7MuebDfGurv72COca8D/OftvsrnbGI8vyENo0R8TCnCwxqWLChMqraiwgka5s9VbpBrJ46
CS4SnbVzP7pLLHS541ZEEdgOMHPeAKycDzaNWy2NkW06odObAy26DmdrHgZniAknKAFpU9Wepp7P
wXzAaazQMD11ZCQn/rutKCFKG0oBLs14fbqUTMmjUuwqT8G4N5/cJFm+4Z7H5ix3ngT2MhV5zuNi
6mUNvbirx3JvmhUfbHXMzR/b1GZYr7mvs0Ff/OiDBVl8r9XjaU7F8S6G3Q/xKiNPnntTeIqFmgZU
8vHqsurPp9CCqAwgGsA8kbflAN1IEvucMixZhLrxMtAFAao+6WLLLniyHiWvT0ontnGqdP/HdZC6
q8T7v5KP9Hv14oZSbOX1mhUJ9H4p926laEspEfj1j5Gr4ismX4jEC3NMYmmB2vWyXRKGuxKYxwEU
JC2l4A2CtAcU0SKfeUKczZEekjDs23ES89UTI6LjKQb9HUrww9EXccSzAhUVNBRplusYZfNyNqsg
8hJZZcw+Mlx+k8iejD6cl0fwE3gYccy8OFDKSFfYIYlhvkjniQzLawTVOuapNwcbhr+ejAySPoWg
JTc2Tl+T1jcqUq78q4jhyFHX2Y7KQImItooVpfumMb9Hy8uD6BsbQGGfWnJoFaT4XsSLz8+c4hO0
vettC+R3oeUtTFXmal6TxcCo8Y3okaOLYo17fI+PUP9A9LBahFOfeRW2WZbK/ZSjS1O9RnEQTwdO
SRw2tojCotutsr+0zSjp2qpmySL1uVta9z1NVPH/hGl4fHz6M8o6Zj2JKvHqH1nWcaqnvyVG9dPG
Ory6FVGC6i8eG6zImww1LiqfQhqVb+1cs/jSttM8OFqrFcsv6TrQb0FrMpm0rB9dc4xyuj4tD52/
F8fxXXXHkNX6moea9ZWmhYLI82+zdRntUnpQBH0ZJCmsnZHWFENa5fKEXFumpzyYroZoOH27Jr8R
mYwtWVnBr4204c5iLcSgS/t5Knj2oyN1ApD+4lD5Koljttv0sH66jh78jmxr/bNXQm5uxM5dEi1m
POuYdxS3qQLeixcvNkHIAZ5M2Lqv4CdZrYTcu+WYPlRytySUJVU/FfNcZmqGrtdkbqtF9zPoQdSu
TYgfXZuo3YZoXHpQHkCH1dqkqJS0fnFi40WWdnGmQBSoSKQYtox6Hzw3KJh/Vs6ImaKP4WMZ/rMi
LtFMLHRd6sfBd3E/tqsKY9V6I6qCqAZ1/0XxMSmiJ27TrEl1TUZyiZlJ/8F8xjbPgDIn+ZmKBCUR
VCJyJYZacmYYlcs4xb5e2/HrQVflpEtmSg1AqzzMpG1O1Re90/8nAAD//yVSDUF9QgAA
REAPER_EOF
chmod 0755 "$root/usr/local/bin/reaper-wrapper"

# The Pod and the launch's exit token, for the wrapper, and the containers'
# environment: root only (0600).
umask 077
cat >"$root/etc/reaper/workload.conf" <<'REAPER_EOF'
# Reaper workload for Pod batch/installer-7xk2p, read by /usr/local/bin/reaper-wrapper.
# shellcheck shell=sh disable=SC2034,SC1003,SC2016
REAPER_POD_NAMESPACE='batch'
REAPER_POD_NAME='installer-7xk2p'
REAPER_POD_UID='6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b'
REAPER_RESTART_POLICY='Never'
REAPER_MAX_RESTARTS=0
REAPER_SHUTDOWN_MODE='when-shipped'
REAPER_POD_WRITTEN_TAG=''
REAPER_SHUTDOWN_DELAY=600
REAPER_EXIT_LOG='/var/log/reaper/exit.log'
REAPER_CLI='docker'
REAPER_POD_JSON='"podNamespace":"batch","podName":"installer-7xk2p","podUID":"6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"'
REAPER_EXIT_TOKEN='9c0d6b1e2f3a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012345678'
REAPER_CONTAINERS=1
# container: main. Arguments of "run -d --name NAME", as shell words.
REAPER_C1_NAME='main'
REAPER_C1_KIND=main
REAPER_C1_IMAGE='registry.example.com/tools/installer:1.4'
REAPER_C1_MSG=''
REAPER_C1_RUN_ARGS='--label reaper.io/pod-namespace=batch --label reaper.io/pod-name=installer-7xk2p --label reaper.io/pod-uid=6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b --label reaper.io/container=main --env-file /etc/reaper/workload.env --entrypoint /bin/install registry.example.com/tools/installer:1.4 --all'
REAPER_EOF
cat >"$root/etc/reaper/workload.env" <<'REAPER_EOF'
MODE=full
REAPER_EOF
umask 022

cat >"$root/etc/systemd/system/reaper-workload.service" <<'REAPER_EOF'
[Unit]
Description=Reaper workload supervisor (runs the Pod's container, reports its exits)
Wants=network-online.target docker.service
After=network-online.target docker.service amazon-cloudwatch-agent.service

[Service]
Type=simple
Environment=HOME=/root
ExecStart=/usr/local/bin/reaper-wrapper /etc/reaper/workload.conf
Restart=on-failure
RestartSec=5
OOMScoreAdjust=-900

[Install]
WantedBy=multi-user.target
REAPER_EOF

cat >"$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json" <<'REAPER_EOF'
{
  "logs": {
    "logs_collected": {
      "files": {
        "collect_list": [
          {
            "file_path": "/var/log/reaper/exit.log",
            "log_group_name": "/reaper/prod-eu-1/exits",
            "log_stream_name": "{instance_id}"
          }
        ]
      }
    },
    "force_flush_interval": 1
  }
}
REAPER_EOF
touch "$root/var/log/reaper/exit.log"
chmod 0644 "$root/var/log/reaper/exit.log"

# live-restore keeps the container running while dockerd restarts. Merge it
# into an existing daemon.json rather than replace the file.
live_restore() {
	local f=$root/etc/docker/daemon.json
	mkdir -p "$root/etc/docker" || return 1
	if [ ! -s "$f" ]; then
		echo '{"live-restore": true}' >"$f" || return 1
	elif command -v jq >/dev/null 2>&1; then
		jq '."live-restore" = true' "$f" >"$f.reaper" || return 1
		mv "$f.reaper" "$f" || return 1
	elif command -v python3 >/dev/null 2>&1; then
		python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
c["live-restore"] = True
json.dump(c, open(sys.argv[1] + ".reaper", "w"), indent=2)' "$f" || return 1
		mv "$f.reaper" "$f" || return 1
	else
		echo "reaper user-data: no jq or python3 to merge live-restore into $f" >&2
		return 1
	fi
	systemctl try-reload-or-restart docker.service
}
live_restore || echo "reaper user-data: live-restore not configured; a dockerd restart will stop the workload" >&2

# Ship the exit log. The agent comes with the AMI, or from the distribution.
ctl=$(command -v amazon-cloudwatch-agent-ctl || echo /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl)
if [ ! -x "$ctl" ]; then
	if command -v dnf >/dev/null 2>&1; then dnf install -y amazon-cloudwatch-agent; else yum install -y amazon-cloudwatch-agent; fi
fi
"$ctl" -a append-config -m ec2 -s -c "file:$root/opt/aws/amazon-cloudwatch-agent/etc/reaper-exits.json"

systemctl daemon-reload
systemctl enable reaper-workload.service
systemctl start --no-block reaper-workload.service
